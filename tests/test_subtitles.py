"""Subtitle cues from timed words (parakeet_stream/subtitles.py), checked with well-kept parsers
(srt, webvtt-py), and parakeet-transcribe's --format / --out / progress bar."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import srt
import webvtt

from parakeet_stream import subtitles

ROOT = Path(__file__).resolve().parent.parent
AUDIO = ROOT / "tests" / "fixtures" / "audio"


def words(text: str, start: float = 0.0, step: float = 0.3) -> list[dict]:
    return [{"word": w, "start": round(start + i * step, 3), "end": round(start + i * step + 0.25, 3)}
            for i, w in enumerate(text.split())]


def test_cues_end_with_utterances_and_fill_two_lines_of_the_limit():
    first = words("the quick brown fox jumps over the lazy dog and keeps running far away from home")
    second = words("a new utterance", start=10.0)
    cues = subtitles.cues([first, second], max_line_chars=20)
    assert all(len(line) <= 20 for c in cues for line in c.lines)
    assert all(1 <= len(c.lines) <= 2 for c in cues)
    assert [w for c in cues for line in c.lines for w in line.split()] == [w["word"] for w in first + second]
    assert cues[-1].lines == ("a new utterance",) and cues[-1].start == 10.0  # never joined to the first
    assert [c.start for c in cues] == sorted(c.start for c in cues)
    assert all(c.start <= c.end for c in cues)
    pairs = [c.lines for c in cues if len(c.lines) == 2]
    assert pairs and all(len(a) + 1 + len(b.split()[0]) > 20 for a, b in pairs)  # broken only where a word would not fit


def test_a_word_longer_than_a_line_gets_its_own_line():
    cues = subtitles.cues([words("a supercalifragilisticexpialidocious word")], max_line_chars=10)
    assert [line for c in cues for line in c.lines] == ["a", "supercalifragilisticexpialidocious", "word"]


def test_srt_and_vtt_load_in_their_parsers_with_the_cue_times():
    cues = subtitles.cues([words("one two three four", start=3599.5), words("<b> & more", start=3700)], 12)
    parsed = list(srt.parse(subtitles.srt(cues)))
    assert [p.content.split("\n") for p in parsed] == [list(c.lines) for c in cues]
    assert [(p.start.total_seconds(), p.end.total_seconds()) for p in parsed] == [(c.start, c.end) for c in cues]
    assert subtitles.srt(cues).splitlines()[1] == "00:59:59,500 --> 01:00:00,650"
    captions = webvtt.WebVTT.from_string(subtitles.vtt(cues), strict=True).captions
    assert [c.start for c in captions] == ["00:59:59.500", "01:01:40.000"]
    assert captions[-1].text == "&lt;b&gt; &amp; more"  # escaped: no markup from the transcript


def test_a_diarized_transcript_gives_a_cue_per_speaker_named_in_order_of_first_speech():
    said = words("hello there how are you fine thanks and you")
    for w, speaker in zip(said, [2, 2, 0, 0, 0, 2, 2, 1, 1]):
        w["speaker"] = speaker
    cues = subtitles.cues([said, words("goodbye", start=5.0)], max_line_chars=42)
    assert [(c.speaker, c.lines) for c in cues] == [
        ("A", ("hello there",)), ("B", ("how are you",)), ("A", ("fine thanks",)), ("C", ("and you",)), (None, ("goodbye",))]
    captions = webvtt.WebVTT.from_string(subtitles.vtt(cues), strict=True).captions
    assert [(c.voice, c.text) for c in captions] == [(c.speaker, "\n".join(c.lines)) for c in cues]
    assert [p.content for p in srt.parse(subtitles.srt(cues))][:2] == ["[A] hello there", "[B] how are you"]
    assert [subtitles.speaker_name(k) for k in (0, 25, 26, 27, 52)] == ["A", "Z", "AA", "AB", "BA"]


def test_no_words_no_cues():
    assert subtitles.srt(subtitles.cues([[]])) == ""
    assert subtitles.vtt([]) == "WEBVTT\n\n"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "parakeet_stream.tools.transcribe", *args], capture_output=True,
                          text=True, timeout=300, cwd=ROOT, env=dict(os.environ))


def test_transcribe_writes_subtitles_per_file_with_a_progress_bar(tiny_model_dir, tmp_path):
    files = [str(AUDIO / "sentence.wav"), str(AUDIO / "pause.wav")]
    out = tmp_path / "subs"
    written = run(*files, "--model", str(tiny_model_dir), "--format", "srt", "--out", str(out), "--max-line-chars", "16")
    as_json = run(*files, "--model", str(tiny_model_dir), "--format", "json")
    assert written.returncode == 0 and as_json.returncode == 0, written.stderr + as_json.stderr
    assert written.stdout == "" and "2/2" in written.stderr  # tqdm's bar, on stderr
    assert sorted(p.name for p in out.iterdir()) == ["pause.srt", "sentence.srt"]
    for line in as_json.stdout.splitlines():
        result = json.loads(line)
        cues = list(srt.parse((out / f"{Path(result['file']).stem}.srt").read_text()))
        assert [w for c in cues for w in c.content.split()] == [w["word"] for w in result["words"]]
        assert all(len(line) <= 16 for c in cues for line in c.content.split("\n"))
        assert cues[0].start.total_seconds() == result["words"][0]["start"]
        assert result["utterances"] and result["text"]


def test_transcribe_prints_one_file_as_vtt_and_refuses_what_cannot_work(tiny_model_dir, tmp_path):
    sentence = str(AUDIO / "sentence.wav")
    printed = run(sentence, "--model", str(tiny_model_dir), "--format", "vtt")
    several = run(sentence, sentence, "--model", str(tiny_model_dir), "--format", "srt")
    offline = run(sentence, "--model", str(tiny_model_dir), "--format", "srt", "--offline", "--out", str(tmp_path))
    same_name = run(sentence, str(tmp_path / "sentence.wav"), "--model", str(tiny_model_dir), "--out", str(tmp_path))
    assert printed.returncode == 0 and webvtt.WebVTT.from_string(printed.stdout, strict=True).captions
    assert printed.stderr == ""  # one file: no progress bar
    assert several.returncode == 2 and several.stderr.strip().endswith("for several, give --out DIR")
    assert offline.returncode == 2 and "--offline does not give" in offline.stderr
    assert same_name.returncode == 2 and "several files would write" in same_name.stderr


def test_chinese_and_japanese_words_join_without_spaces_and_count_two_columns():
    chars = [{"word": ch, "start": i * 0.2, "end": i * 0.2 + 0.2} for i, ch in enumerate("今日は東京でとても暑いです")]
    mixed = chars[:6] + words("GPU cluster", start=1.2) + chars[6:]
    cues = subtitles.cues([mixed], max_line_chars=12)
    # six wide characters fill 12 columns; "GPU cluster" (11 columns) keeps its space
    assert [c.lines for c in cues] == [("今日は東京で", "GPU cluster"), ("とても暑いで", "す")]
    text = subtitles.srt(cues)
    assert [s.content for s in srt.parse(text)] == ["\n".join(c.lines) for c in cues]
