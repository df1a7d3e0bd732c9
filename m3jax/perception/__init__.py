"""m3jax.perception: media -> identities and transcripts.

  media.iter_clips(path, ...) -> Iterator[Clip]           video decoding: frames at the perception fps, 16 kHz audio
  faces.detect_faces(frames, ...) -> [FaceDetection]      dlib detection + 128-d embeddings (FaceBackend)
  faces.cluster_faces(embeddings, threshold) -> labels    greedy online clustering of one clip's faces
  speech.segment_speech(audio, sr, ...) -> [SpeechSegment] Silero VAD + GE2E speaker-change splitting
  voices.SpeakerEncoder.load().embed(segments) -> [N, 256] GE2E (Resemblyzer) speaker embeddings
  vad.SileroVAD, audio (resampling, Resemblyzer mel front end), asr.Transcriber (Whisper), asr_models (by name)
"""
