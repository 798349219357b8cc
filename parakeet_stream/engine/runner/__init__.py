"""The ModelRunner and what it alone uses: model_runner.py (a step's pre-encode, encode and decode,
the decode routing between greedy passes and beams), cuda_graphs.py (static batches: CUDA graphs
and their eager stand-in), cuda_streams.py (each stage's CUDA stream and the step's marks),
beams.py (key-phrase streams' commits)."""
