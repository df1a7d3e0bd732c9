"""Weight readers: Hugging Face safetensors directories, GGUF, CTranslate2, torch zip checkpoints."""
