"""Videos of played episodes: RGB frames written as an animated GIF (Pillow, which matplotlib
brings) or an MP4 (OpenCV's writer, where opencv-python-headless is installed: the atari extra).

Also the output files' two rules, which `data.trajectories` follows for its datasets too: a new
path is checked before anything is made (`check_new_path`), and a file is written whole or not
at all (`written_whole`)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import uuid

import numpy as np


def check_new_path(path: str, kind: str, suffixes: tuple[str, ...]) -> None:
    """Refuses, before anything is made, an output path (of a `kind` file) that does not end in
    one of `suffixes`, that exists, or whose directory does not (each in one line)."""
    if os.path.splitext(path)[1].lower() not in suffixes:
        raise ValueError(f"{kind} path must end in {' or '.join(suffixes)}, got {path!r}")
    if os.path.exists(path):
        raise ValueError(f"{path} exists; choose another path")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"the directory of {path} does not exist: create {directory} first")


@contextlib.contextmanager
def written_whole(path: str):
    """A new temporary file's path beside `path` to write to: renamed to `path` as the block
    ends, removed if it raises, so `path` is written whole or not at all. Its suffix is `path`'s
    (a writer may choose the format by it)."""
    directory, suffix = os.path.dirname(os.path.abspath(path)), os.path.splitext(path)[1]
    tmp = os.path.join(directory, f".genesis-jax-partial-{uuid.uuid4().hex}{suffix}")
    os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))  # a new file's mode (umask), not mkstemp's 0600
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def check_video_path(path: str) -> None:
    """Refuses, before anything is played, a video path that is not a new .gif or .mp4 in an
    existing directory, or an .mp4 without OpenCV to write it (each in one line)."""
    check_new_path(path, "video", (".gif", ".mp4"))
    if path.lower().endswith(".mp4") and importlib.util.find_spec("cv2") is None:
        raise ImportError(
            "writing an .mp4 needs opencv-python-headless: pip install 'genesis-jax[atari]' (or name a .gif)"
        )


def write_video(frames: list[np.ndarray], path: str, fps: int = 30) -> None:
    """`frames` (uint8 [height, width, 3] each, one size) as a .gif or .mp4 at `fps` frames a
    second, written whole or not at all (`written_whole`)."""
    if not frames:
        raise ValueError(f"no frames to write to {path}")
    with written_whole(path) as tmp:
        if path.lower().endswith(".gif"):
            from PIL import Image

            images = [Image.fromarray(np.asarray(f, np.uint8)) for f in frames]
            images[0].save(tmp, save_all=True, append_images=images[1:], duration=max(1, round(1000 / fps)), loop=0)
        else:
            import cv2

            height, width = frames[0].shape[:2]
            writer = cv2.VideoWriter(tmp, cv2.VideoWriter_fourcc(*"mp4v"), float(fps), (width, height))
            try:
                for frame in frames:
                    writer.write(cv2.cvtColor(np.asarray(frame, np.uint8), cv2.COLOR_RGB2BGR))
            finally:
                writer.release()
