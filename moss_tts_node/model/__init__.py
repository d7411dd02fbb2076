"""The MOSS-TTS-Delay model outside llama.cpp: its spec, embeddings, heads, delay pattern, sampling, step loop."""
