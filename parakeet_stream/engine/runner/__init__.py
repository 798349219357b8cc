"""The ModelRunner and what it alone uses: model_runner.py (a step's stages, the encoder cache and prompt
pools, the static batches), pre_encoder.py (a step's chunks cut and subsampled into batches),
step_decoder.py (the decode routing between greedy passes and beams, the decoder's pools),
cuda_graphs.py (static batches: CUDA graphs and their eager stand-in), cuda_streams.py (each stage's
CUDA stream and the step's marks), beams.py (key-phrase streams' commits)."""
