"""m3jax.perception: media -> identities and transcripts.

  faces.detect_faces(frames, ...) -> [FaceDetection]      dlib detection + 128-d embeddings (FaceBackend)
  speech.segment_speech(audio, sr, ...) -> [SpeechSegment] Silero VAD + GE2E speaker-change splitting
  voices.SpeakerEncoder.load().embed(segments) -> [N, 256] GE2E (Resemblyzer) speaker embeddings
  vad.SileroVAD, audio (resampling, Resemblyzer mel front end), asr.Transcriber (Whisper), logmel
"""
