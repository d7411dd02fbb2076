"""llama.cpp: the C bridge (built on first use), the backbone it runs, and GGUF reading."""
