import numpy as np
import pytest
import soundfile as sf

from parakeet_stream.audio import (
    SAMPLE_RATE,
    AudioError,
    StreamResampler,
    check_rate,
    check_samples,
    decode_f32,
    decode_pcm16,
    read_audio,
    resample,
)


def tone(rate, seconds=1.0, freq=440.0, channels=1):
    t = np.arange(int(rate * seconds)) / rate
    wave = (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)
    return np.repeat(wave[:, None], channels, axis=1) if channels > 1 else wave


def peak_hz(samples, rate=SAMPLE_RATE):
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return np.argmax(spectrum) * rate / len(samples)


@pytest.mark.parametrize(
    "rate, channels, subtype",
    [
        (8000, 1, "PCM_16"),
        (16000, 1, "PCM_16"),
        (22050, 2, "FLOAT"),
        (44100, 2, "PCM_24"),
        (48000, 1, "PCM_32"),
        (48000, 6, "PCM_16"),
    ],
)
def test_read_audio(tmp_path, rate, channels, subtype):
    path = tmp_path / "tone.wav"
    sf.write(path, tone(rate, 0.75, channels=channels), rate, subtype=subtype)
    audio = read_audio(path)
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert abs(len(audio) - 0.75 * SAMPLE_RATE) <= 1
    assert abs(peak_hz(audio) - 440) < 3
    assert 0.45 < np.abs(audio[1000:-1000]).max() < 0.55


def test_read_audio_mixes_channels_by_mean(tmp_path):
    left = tone(SAMPLE_RATE, 0.1)
    path = tmp_path / "stereo.wav"
    sf.write(path, np.stack([left, np.zeros_like(left)], axis=1), SAMPLE_RATE, subtype="FLOAT")
    np.testing.assert_allclose(read_audio(path), left / 2, atol=1e-7)


def test_read_audio_errors(tmp_path):
    with pytest.raises(AudioError, match="no such file"):
        read_audio(tmp_path / "missing.wav")
    junk = tmp_path / "junk.wav"
    junk.write_bytes(b"this is not audio at all" * 10)
    with pytest.raises(AudioError, match="junk.wav"):
        read_audio(junk)
    empty = tmp_path / "empty.wav"
    sf.write(empty, np.zeros(0, np.float32), SAMPLE_RATE)
    with pytest.raises(AudioError, match="contains no audio"):
        read_audio(empty)
    nan = tmp_path / "nan.wav"
    sf.write(nan, np.array([0.0, np.nan], np.float32), SAMPLE_RATE, subtype="FLOAT")
    with pytest.raises(AudioError, match="NaN"):
        read_audio(nan)


def test_resample_identity_and_length():
    x = tone(SAMPLE_RATE, 0.5)
    np.testing.assert_array_equal(resample(x, SAMPLE_RATE), x)
    assert len(resample(tone(48000), 48000)) == SAMPLE_RATE
    assert len(resample(tone(SAMPLE_RATE), SAMPLE_RATE, 8000)) == 8000


@pytest.mark.parametrize("rate", [8000, 16000, 22050, 24000, 44100, 48000, 11025, 4000, 192000])
def test_stream_resampler_matches_whole(rate):
    rng = np.random.default_rng(rate)
    x = (0.3 * rng.standard_normal(int(rate * 0.6))).astype(np.float32)
    stream = StreamResampler(rate)
    out, i = [], 0
    while i < len(x):
        n = int(rng.integers(1, rate // 10))
        out.append(stream.push(x[i : i + n]))
        i += n
    out.append(stream.push(np.zeros(0, np.float32), last=True))
    streamed, whole = np.concatenate(out), resample(x, rate)
    assert abs(len(streamed) - len(whole)) <= 1
    n = min(len(streamed), len(whole))
    np.testing.assert_allclose(streamed[:n], whole[:n], atol=1e-4)


def test_stream_resampler_rejects_bad_rates_and_late_audio():
    for rate in (0, 3999, 192001, 16000.5, "16000", True):
        with pytest.raises(AudioError):
            StreamResampler(rate)
    stream = StreamResampler(48000)
    stream.push(np.zeros(480, np.float32), last=True)
    with pytest.raises(AudioError):
        stream.push(np.zeros(480, np.float32))


def test_check_rate():
    assert check_rate(np.int64(22050)) == 22050


def test_decode_pcm16():
    pcm = np.array([0, 16384, -32768, 32767], dtype="<i2").tobytes()
    np.testing.assert_allclose(decode_pcm16(pcm), [0, 0.5, -1, 32767 / 32768])
    assert decode_pcm16(pcm).dtype == np.float32
    assert len(decode_pcm16(b"")) == 0
    with pytest.raises(AudioError, match="odd"):
        decode_pcm16(b"\x00\x01\x02")


def test_decode_f32():
    values = np.array([0.0, -0.25, 1.5], dtype="<f4")
    np.testing.assert_array_equal(decode_f32(values.tobytes()), values)
    with pytest.raises(AudioError, match="multiple of 4"):
        decode_f32(b"\x00" * 6)
    for bad in (np.nan, np.inf, -np.inf):
        with pytest.raises(AudioError, match="NaN"):
            decode_f32(np.array([0.0, bad], dtype="<f4").tobytes())


def test_check_samples():
    assert check_samples([0.1, -0.2]).dtype == np.float32
    for bad in ([[0.1, 0.2]], 0.5, [0.1, float("nan")], ["a"], [0.1, None]):
        with pytest.raises(AudioError):
            check_samples(bad)
