"""Offline model preparation: checkpoint conversion, attach-heads, TensorRT engines, the stream decoder graph."""
