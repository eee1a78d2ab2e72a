"""A small speech recogniser trained with CTC, batched by frames: log-mel frames in, a stack of 1-D
convolutions (two of stride 2, as the subsampling front ends of wav2letter-style and conformer encoders),
characters out. The frames are the "tokens": `run.token_batches` cuts micro-batches whose padded size
(utterances x the longest in the batch, in frames) stays within the config's `max_tokens`, so a search finds
the largest cap that fits, and the long utterances an epoch holds cannot run a normal run out of memory.

The durations follow LibriSpeech's (Panayotov et al., "LibriSpeech: an ASR corpus based on public domain
audio books", ICASSP 2015): its table 1 gives train-clean-100 as 100.6 hours, which it holds in 28,539
utterances, a mean of 12.7 s, and its alignment cuts the audio into segments of at most 35 s. Approximated
here by a lognormal of mean 12.7 s (sigma 0.5, so a median near 11 s and about one utterance in a hundred
reaching the 35 s cap), clipped to [1, 35] s, at the usual 10 ms frame shift (100 frames a second), then
scaled down 10 times for a CPU: at most 350 frames of 40 mel bands (80 in the usual recipe), mean about 129.
(The figures are quoted as read, the shape is an approximation; nothing here depends on the exact figures.)

Padded per batch (`collate`), the frames past each utterance's end zeroed after every layer, so an
utterance's loss does not depend on the batch it lands in; CTC's mean loss over each micro-batch. Features
and transcripts are seeded random numbers built at import.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch.nn import functional as F

from autofit import autofit

MELS = 40
CHARACTERS = 29  # CTC's blank (0), 26 letters, space and apostrophe
UTTERANCES = 512
SCALE = 10
FRAMES_PER_CHARACTER = 8  # transcripts within CTC's reach after the 4x subsampling


def librispeech_like_frames(n: int, seed: int = 0) -> list[int]:
    """Frames per utterance: lognormal(mean 12.7 s, sigma 0.5) clipped to [1, 35] s, 100 frames a second,
    divided by SCALE."""
    sigma = 0.5
    mu = math.log(12.7) - sigma**2 / 2  # a lognormal's mean is exp(mu + sigma^2 / 2)
    generator = torch.Generator().manual_seed(seed)
    seconds = torch.exp(mu + sigma * torch.randn(n, generator=generator)).clamp(1, 35)
    return [int(100 * s) // SCALE for s in seconds.tolist()]


FRAMES = librispeech_like_frames(UTTERANCES)


class Utterances(torch.utils.data.Dataset):
    """Log-mel-like features (frames x MELS) and a character transcript of about one per 8 frames."""

    def __init__(self, frames: list[int], seed: int = 1) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.items = [(torch.randn(n, MELS, generator=generator),
                       torch.randint(1, CHARACTERS, (max(1, n // FRAMES_PER_CHARACTER),), generator=generator))
                      for n in frames]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int):
        return self.items[index]


DATA = Utterances(FRAMES)


def collate(items):
    """Features padded with zeros to the batch's longest (batch x MELS x frames, as Conv1d takes them), the
    frame counts, the transcripts padded (CTC reads only each one's length) and their lengths."""
    longest = max(len(features) for features, _ in items)
    longest_text = max(len(text) for _, text in items)
    features = torch.zeros(len(items), MELS, longest)
    texts = torch.zeros(len(items), longest_text, dtype=torch.long)
    for row, (frames, text) in enumerate(items):
        features[row, :, : len(frames)] = frames.T
        texts[row, : len(text)] = text
    frames = torch.tensor([len(f) for f, _ in items])
    text_lengths = torch.tensor([len(t) for _, t in items])
    return features, frames, texts, text_lengths


class ConvCTC(nn.Module):
    """Conv1d layers over time (two of stride 2), each normalised per frame (a batch norm would mix the
    utterances of a batch and count its padding), GELU between, a per-frame linear read-out of characters."""

    def __init__(self, width: int = 128, layers: int = 4) -> None:
        super().__init__()
        self.convs = nn.ModuleList(
            nn.Conv1d(MELS if i == 0 else width, width, 5, stride=2 if i < 2 else 1, padding=2) for i in range(layers))
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(layers))
        self.head = nn.Conv1d(width, CHARACTERS, 1)

    def forward(self, features: torch.Tensor, frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = features
        for conv, norm in zip(self.convs, self.norms):
            h = F.gelu(norm(conv(h).transpose(1, 2)).transpose(1, 2))
            if conv.stride[0] > 1:
                frames = (frames - 1) // conv.stride[0] + 1  # what a lone utterance's conv would output
            mask = torch.arange(h.shape[-1], device=h.device)[None, :] < frames[:, None]
            h = h * mask[:, None, :]  # past the utterance's end: zeros, as its conv's own padding
        return self.head(h), frames


@autofit
def train(run):
    torch.manual_seed(0)
    model = ConvCTC().to(run.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = run.token_batches(DATA, FRAMES, collate_fn=collate, seed=0)
    epochs = 10**6 if run.probing else 1  # a probe stops itself after its steps
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for features, frames, texts, text_lengths in run.batches(loader):
            with run.autocast():
                logits, out_frames = model(features, frames)
            log_probs = logits.float().log_softmax(1).permute(2, 0, 1)  # CTC's (time, batch, characters)
            loss = F.ctc_loss(log_probs, texts, out_frames, text_lengths, zero_infinity=True)
            run.backward(loss, optimizer)
    print(f"speech_tokens: done, {run.optimizer_steps} optimizer steps", flush=True)


if __name__ == "__main__":
    train()
