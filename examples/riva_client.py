"""Transcribe a WAV file with NVIDIA's official Riva client (`pip install nvidia-riva-client`),
pointed at parakeet-stream by its address only: the same code runs against a Riva server or an
ASR NIM.

    python examples/riva_client.py audio.wav [127.0.0.1:50051] [API_KEY]

Lists the served models, streams the file at real time (interim and final results, words with
their times), then sends it whole to `Recognize`.
"""
import sys
import time

import numpy as np
import riva.client

from parakeet_stream.audio import AudioError, read_file

CHUNK_SECONDS = 0.1


def main(path: str, server: str = "127.0.0.1:50051", key: str | None = None) -> None:
    try:
        samples, rate = read_file(path, "int16")
    except AudioError as exc:  # one line: no such file, empty, not audio
        sys.exit(f"error: {exc}")
    pcm = samples.mean(axis=1).astype(np.int16).tobytes()  # mono
    metadata = [["authorization", f"Bearer {key}"]] if key else None
    asr = riva.client.ASRService(riva.client.Auth(uri=server, use_ssl=False, metadata_args=metadata))

    request = riva.client.proto.riva_asr_pb2.RivaSpeechRecognitionConfigRequest()
    models = asr.stub.GetRivaSpeechRecognitionConfig(request)
    for model in models.model_config:
        print(f"model {model.model_name} ({model.parameters['type']}): {dict(model.parameters)}")

    config = riva.client.RecognitionConfig(
        encoding=riva.client.AudioEncoding.LINEAR_PCM, sample_rate_hertz=rate, language_code="en-US",
        max_alternatives=1, enable_word_time_offsets=True,
    )
    streaming = riva.client.StreamingRecognitionConfig(config=config, interim_results=True)
    for response in asr.streaming_response_generator(paced(pcm, rate), streaming):
        for result in response.results:
            show(result)

    whole = asr.offline_recognize(pcm, config)
    print("Recognize:", "".join(result.alternatives[0].transcript for result in whole.results).strip())


def paced(pcm: bytes, rate: int):
    step = int(rate * CHUNK_SECONDS) * 2
    for start in range(0, len(pcm), step):
        yield pcm[start : start + step]
        time.sleep(CHUNK_SECONDS)  # real time, as a microphone would


def show(result) -> None:
    alternative = result.alternatives[0]
    if not result.is_final:
        print(f"interim: {alternative.transcript}")
        return
    words = alternative.words
    timing = f" [{words[0].start_time / 1000:.2f}-{words[-1].end_time / 1000:.2f} s]" if words else ""
    print(f"final: {alternative.transcript.strip()}{timing} (audio processed: {result.audio_processed:.2f} s)")


if __name__ == "__main__":
    main(*sys.argv[1:4])
