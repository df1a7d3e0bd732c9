"""Supervised fine-tuning of memorizers on generated episodes' gold memories: the Omni thinker on clip media
(`data`), or a text LLM as the memory writer on perception output (`writer_data`)."""
