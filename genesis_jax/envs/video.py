"""Videos of played episodes: RGB frames written as an animated GIF (Pillow, which matplotlib
brings) or an MP4 (OpenCV's writer, where opencv-python-headless is installed: the atari extra)."""

from __future__ import annotations

import importlib.util
import os
import tempfile

import numpy as np

VIDEO_SUFFIXES = (".gif", ".mp4")


def check_video_path(path: str) -> None:
    """Refuses, before anything is played, a video path that is not a new .gif or .mp4 in an
    existing directory, or an .mp4 without OpenCV to write it (each in one line)."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in VIDEO_SUFFIXES:
        raise ValueError(f"video path must end in .gif or .mp4, got {path!r}")
    if suffix == ".mp4" and importlib.util.find_spec("cv2") is None:
        raise ImportError(
            "writing an .mp4 needs opencv-python-headless: pip install 'genesis-jax[atari]' (or name a .gif)"
        )
    if os.path.exists(path):
        raise ValueError(f"{path} exists; choose another path")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"the directory of {path} does not exist: create {directory} first")


def write_video(frames: list[np.ndarray], path: str, fps: int = 30) -> None:
    """`frames` (uint8 [height, width, 3] each, one size) as a .gif or .mp4 at `fps` frames a
    second; written beside `path` and renamed into place, so a failure leaves no partial file."""
    if not frames:
        raise ValueError(f"no frames to write to {path}")
    suffix = os.path.splitext(path)[1].lower()
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".genesis-jax-video-", suffix=suffix)
    os.close(fd)
    try:
        if suffix == ".gif":
            from PIL import Image

            images = [Image.fromarray(np.asarray(f, np.uint8)) for f in frames]
            duration = max(1, round(1000 / fps))
            images[0].save(tmp, save_all=True, append_images=images[1:], duration=duration, loop=0)
        else:
            import cv2

            height, width = frames[0].shape[:2]
            writer = cv2.VideoWriter(tmp, cv2.VideoWriter_fourcc(*"mp4v"), float(fps), (width, height))
            try:
                for frame in frames:
                    writer.write(cv2.cvtColor(np.asarray(frame, np.uint8), cv2.COLOR_RGB2BGR))
            finally:
                writer.release()
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
