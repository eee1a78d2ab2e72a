"""nanoGPT's own repository (tests/corpus/nanogpt_repo) made runnable where nothing can be downloaded: its
files copied to a folder, with a small character corpus in data/shakespeare_char's format. The
nanoGPT test and the experts benchmark's held-out pair both run it from such a folder."""

from __future__ import annotations

import os
import pickle
import random
import shutil

import numpy as np

from tests.support import CORPUS


def character_corpus(directory) -> None:
    """train.bin and val.bin (uint16 character ids) and meta.pkl, as nanoGPT's prepare.py writes them."""
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 8))) for _ in range(300)]
    text = "\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(4000))
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
    cut = int(len(ids) * 0.9)
    os.makedirs(directory)
    ids[:cut].tofile(os.path.join(directory, "train.bin"))
    ids[cut:].tofile(os.path.join(directory, "val.bin"))
    with open(os.path.join(directory, "meta.pkl"), "wb") as handle:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}, handle)


def nanogpt_folder(folder) -> str:
    """nanoGPT's train.py, model.py and configurator.py in `folder`, with its data; the train.py path."""
    shutil.copytree(os.path.join(CORPUS, "nanogpt_repo"), folder, dirs_exist_ok=True)
    character_corpus(os.path.join(folder, "data", "shakespeare_char"))
    return os.path.join(folder, "train.py")
