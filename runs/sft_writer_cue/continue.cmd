# continues this run from its newest checkpoint (run from the repository root)
python train.py sft --config configs/sft_writer_cue.py --set chunk.max_minutes=68
