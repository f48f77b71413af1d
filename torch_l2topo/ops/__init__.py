"""Latency-bound ops for model code, on Triton kernels, registered with torch.library.

embedding_bag(input, weight, offsets, ...) is torch.nn.functional.embedding_bag on a bandwidth-designed gather
(forward and backward); forest_predict(forest, x) runs a tree ensemble (Forest.from_sklearn,
Forest.from_xgboost_json) with one walk per sample and tree. Both are torch.library custom ops (fake
implementations, torch.compile(fullgraph=True), CUDA graph capture), run torch or a pure-torch reference on
the CPU, and accept `policy=` ("auto", "plain"; the placement policies come with the placement integration).
"""
from .embedding_bag import embedding_bag
from .forest import Forest
from .forest_predict import forest_predict

__all__ = ["embedding_bag", "Forest", "forest_predict"]
