"""Train an EAGLE draft layer (eagle_layer.py) on a frozen base model, from text the model itself generates.

    minillm train-eagle --out eagle.safetensors

The data is Medusa's (medusa_train.py): the base model answers the training
prompts greedily, and one prefill per sequence gives its final hidden state h_p
at every position. The layer then reads whole sequences, teacher-forced: at p
it gets h_p and the embedding of x_{p+1} and predicts ĥ_{p+1}, attending to the
positions before. Two losses, as EAGLE's paper:

* the token: cross-entropy of LM_head(ĥ_{p+1}) against the base model's own
  distribution LM_head(h_{p+1}) (soft labels: every likely token teaches);
* the feature: smooth L1 of ĥ_{p+1} against h_{p+1}, weighted feature_weight.

Both are taken where the guessed token x_{p+2} lies in the answer (the prompt
positions are read as context only). With `noise`, the input features get
Gaussian noise of that fraction of their RMS: at inference the second guess
reads the layer's own imperfect ĥ, not a true h (EAGLE adds uniform noise).

A tenth of the sequences is held out: the top-1 agreement of the first guess
with the base model's greedy token is the acceptance of a one-token draft.
"""
from __future__ import annotations

import dataclasses
import json
import random
import time
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from minillm.spec_decode.eagle_layer import EagleLayer
from minillm.spec_decode.medusa import embedding_fingerprint
from minillm.spec_decode.medusa_train import (check_answer_settings, final_hidden, lm_logits, optimise, own_answers,
                                              split_by_prompt)


@dataclass
class EagleTrainConfig:
    num_chat_prompts: int = 96  # pydoc passages asked about (medusa_prompts.py)
    num_topic_questions: int = 64
    num_general_questions: int = 492  # every everyday question
    passage_chars: int = 360
    max_new_tokens: int = 96
    epochs: int = 4
    batch_sequences: int = 8
    lr: float = 1e-3
    feature_weight: float = 1.0
    noise: float = 0.0  # Gaussian noise on the input features, as a fraction of their RMS
    holdout: float = 0.1
    seed: int = 0
    max_train_seconds: float | None = None
    answers_per_prompt: int = 1  # the greedy answer, then sampled ones (medusa_train.own_answers)
    sample_temperature: float = 0.8
    answers_file: str | None = None  # read the answers from here if it exists, else write them (own_answers)


@dataclass
class EagleTrainReport:
    config: dict
    num_sequences: int = 0
    num_generated_tokens: int = 0
    num_train_positions: int = 0
    steps: int = 0
    generate_s: float = 0.0
    answers_read: bool = False  # the answers came from cfg.answers_file (generate_s is then 0)
    hidden_s: float = 0.0
    train_s: float = 0.0
    loss_curve: list[tuple[int, float]] = field(default_factory=list)
    holdout_loss: float = 0.0  # the training loss on the held-out answers, without input noise
    holdout_untrained_loss: float = 0.0  # the same for the zero-initialised layer
    holdout_top1: float = 0.0  # the first guess agrees with the base model's greedy token
    holdout_untrained_top1: float = 0.0  # the zero-initialised layer: the LM head's own guess for x_{p+1}


def padded_batch(model, seqs: list[tuple[list[int], int]], hiddens: list[torch.Tensor]):
    """Sequences -> (h [B, T, hidden], e(x_{p+1}) [B, T, hidden], target h_{p+1} [B, T, hidden],
    greedy x_{p+2} [B, T], loss mask [B, T]) for p = 0 .. T-1, T = longest sequence - 2."""
    t = max(len(ids) for ids, _ in seqs) - 2
    b, hid = len(seqs), hiddens[0].shape[-1]
    h = torch.zeros(b, t, hid)
    nxt = torch.zeros(b, t, hid)
    tok = torch.zeros(b, t, dtype=torch.long)
    y = torch.zeros(b, t, dtype=torch.long)
    mask = torch.zeros(b, t, dtype=torch.bool)
    for i, ((ids, plen), hs) in enumerate(zip(seqs, hiddens)):
        n = len(ids) - 2  # positions p with x_{p+2} inside the sequence
        ids_t = torch.tensor(ids)
        h[i, :n] = hs[:n].float()
        nxt[i, :n] = hs[1 : n + 1].float()
        tok[i, :n] = ids_t[1 : n + 1]
        y[i, :n] = ids_t[2 : n + 2]
        # x_{p+2} is a generated token after the first: the target chose that one from its prefill itself
        mask[i, max(plen - 1, 0) : n] = True
    emb = model.embed_tokens(tok).float()
    return h, emb, nxt, y, mask


def eagle_loss(model, layer: EagleLayer, cfg: EagleTrainConfig, batch) -> torch.Tensor:
    h, emb, nxt, _, mask = batch
    if cfg.noise:
        h = h + cfg.noise * h.pow(2).mean(-1, keepdim=True).sqrt() * torch.randn_like(h)
    rope = model.rotary.lookup(torch.arange(h.shape[1]))
    pred = layer(h, emb, rope)[mask]
    target = nxt[mask]
    logits = lm_logits(model, pred)
    with torch.no_grad():  # the teacher: the frozen base model's own next-token distribution
        teacher = lm_logits(model, target).softmax(-1)
    loss = nn.functional.cross_entropy(logits, teacher)
    if cfg.feature_weight:
        loss = loss + cfg.feature_weight * nn.functional.smooth_l1_loss(pred, target)
    return loss


@torch.no_grad()
def first_guess_top1(model, layer: EagleLayer, seqs, hiddens, batch: int = 8) -> float:
    """How often the first guess, argmax LM_head(ĥ_{p+1}), is the base model's greedy x_{p+2} (answers only)."""
    right = total = 0
    for s in range(0, len(seqs), batch):
        h, emb, _, y, mask = padded_batch(model, seqs[s : s + batch], hiddens[s : s + batch])
        pred = layer(h, emb, model.rotary.lookup(torch.arange(h.shape[1])))[mask]
        right += int((lm_logits(model, pred).argmax(-1) == y[mask]).sum())
        total += int(mask.sum())
    return right / max(total, 1)


@torch.no_grad()
def held_out_loss(model, layer: EagleLayer, cfg: EagleTrainConfig, seqs, hiddens, batch: int = 8) -> float:
    """eagle_loss over the held-out answers, weighted by positions and without input noise: one fixed set,
    so a trained and an untrained layer compare whatever order the training batches came in."""
    clean = dataclasses.replace(cfg, noise=0.0)
    total = count = 0.0
    for s in range(0, len(seqs), batch):
        b = padded_batch(model, seqs[s : s + batch], hiddens[s : s + batch])
        n = float(b[-1].sum())
        total += float(eagle_loss(model, layer, clean, b)) * n
        count += n
    return total / max(count, 1.0)


def train_layer(model, seqs: list[tuple[list[int], int]], hiddens: list[torch.Tensor], cfg: EagleTrainConfig,
                report: EagleTrainReport, log=print) -> EagleLayer:
    """The optimisation alone, on sequences and their hidden states (train_eagle makes both)."""
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    train, hold = split_by_prompt(len(seqs), cfg.answers_per_prompt, cfg.holdout, rng)
    # batches of similar length: little padding
    train.sort(key=lambda i: len(seqs[i][0]))
    batches = [train[s : s + cfg.batch_sequences] for s in range(0, len(train), cfg.batch_sequences)]
    report.num_train_positions = sum(len(seqs[i][0]) - max(seqs[i][1], 2) for i in train)
    layer = EagleLayer(model.config)
    for p in model.parameters():
        p.requires_grad_(False)

    def epoch_losses():
        rng.shuffle(batches)
        for ids in batches:
            yield eagle_loss(model, layer, cfg, padded_batch(model, [seqs[i] for i in ids], [hiddens[i] for i in ids]))

    optimise(layer, epoch_losses, cfg.epochs, len(batches), cfg.lr, 0.0, cfg.max_train_seconds, report, log)
    layer.eval()
    held = [seqs[i] for i in hold], [hiddens[i] for i in hold]
    report.holdout_top1 = first_guess_top1(model, layer, *held)
    report.holdout_untrained_top1 = first_guess_top1(model, EagleLayer(model.config), *held)
    report.holdout_loss = held_out_loss(model, layer, cfg, *held)
    report.holdout_untrained_loss = held_out_loss(model, EagleLayer(model.config), cfg, *held)
    log(f"held-out first-guess top-1 {report.holdout_top1:.3f} (untrained {report.holdout_untrained_top1:.3f}), "
        f"loss {report.holdout_loss:.3f} (untrained {report.holdout_untrained_loss:.3f})")
    return layer


def train_eagle(model, tokenizer, eos_ids, cfg: EagleTrainConfig, log=print) -> tuple[EagleLayer, EagleTrainReport]:
    for name in ("feature_weight", "noise"):  # before minutes of generation
        if not getattr(cfg, name) >= 0:
            raise ValueError(f"{name} must be >= 0, got {getattr(cfg, name)}")
    if cfg.epochs < 1 or cfg.batch_sequences < 1:
        raise ValueError(f"epochs and batch_sequences must be >= 1, got {cfg.epochs} and {cfg.batch_sequences}")
    check_answer_settings(cfg)
    report = EagleTrainReport(asdict(cfg))
    seqs = own_answers(model, tokenizer, eos_ids, cfg, report, log)
    t0 = time.perf_counter()
    hiddens = [final_hidden(model, ids) for ids, _ in seqs]
    report.hidden_s = time.perf_counter() - t0
    layer = train_layer(model, seqs, hiddens, cfg, report, log)
    layer.metadata = {"base_fingerprint": embedding_fingerprint(model), "report": json.dumps(asdict(report))}
    return layer, report
