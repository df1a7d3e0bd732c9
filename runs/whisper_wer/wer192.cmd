nice -n 5 python bench/whisper.py --wer 192 --models tiny.en,base --no-ct2 --no-memorize
