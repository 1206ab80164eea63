"""Train Medusa-1 (or Hydra) heads on a frozen base model, from text the model itself generates (self-distillation).

    minillm train-medusa --out heads.safetensors            # the default model, a few minutes on 2 cores
    minillm train-medusa --kind hydra --out hydra.safetensors

1. Prompts (spec_decode/medusa_prompts.py): passages of Python's reference
   manual (`pydoc_data.topics`, the "calib" half, never what `minillm eval ppl`
   scores) in chat questions, short questions about its topics' names, everyday
   chat questions, and raw code-completion heads (a function signature and
   docstring); none is a prompt or a subject the benchmarks score.
2. The base model answers them greedily through the engine (batched), so the
   heads learn the distribution they will be asked to guess at temperature 0;
   with `answers_per_prompt` > 1 it also answers each again, sampled, for
   more of its own text (with `distill` the labels stay its distribution).
3. One prefill per sequence gives the final hidden state h_t of every position.
4. Head i (1..K) at position t learns the token at t + 1 + i with cross-entropy
   through the frozen LM head; positions inside the prompt are skipped. The
   base model never changes; only the K residual blocks train (AdamW).
   Hydra heads (hydra_heads.py) also read the tokens before their target,
   teacher-forced: head i reads the true x_{t+1} .. x_{t+i}.
5. With `distill`, the label is the base model's whole next-token
   distribution at t + i (softmax of LM_head(h_{t+i})), not only the token it
   chose: every wrong-but-likely token teaches too (Hydra++'s teacher loss).
   With `feature_weight` w, head i's state also regresses onto h_{t+i}, the
   state the base model itself ranks x_{t+i+1} with (EAGLE's feature loss,
   smooth L1, weighted w against the token loss).

A tenth of the sequences is held out: each head's top-1 accuracy there is the
acceptance a chain of guesses can expect, and goes into the file's metadata
with the loss curve and the command.
"""
from __future__ import annotations

import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from minillm.spec_decode.hydra_heads import HydraHeads
from minillm.spec_decode.medusa import embedding_fingerprint
from minillm.spec_decode.medusa_heads import MedusaHeads
from minillm.spec_decode.medusa_prompts import training_prompts


KINDS = {"medusa": MedusaHeads, "hydra": HydraHeads}


@dataclass
class MedusaTrainConfig:
    kind: str = "medusa"  # or "hydra": heads that also read the tokens guessed before them
    num_heads: int = 3
    num_chat_prompts: int = 96  # pydoc passages asked about
    num_topic_questions: int = 64  # short questions about pydoc topic names
    num_general_questions: int = 124  # everyday chat questions (medusa_prompts.GENERAL_QUESTIONS; 492 in all)
    passage_chars: int = 360
    max_new_tokens: int = 96
    epochs: int = 2
    batch_positions: int = 256
    lr: float = 2e-3
    weight_decay: float = 0.0
    holdout: float = 0.1
    seed: int = 0
    max_train_seconds: float | None = None  # stop the optimisation early (generation is not counted)
    distill: bool = False  # soft labels: the base model's own distribution for the guessed token
    feature_weight: float = 0.0  # weight of the regression of head i's state onto h_{t+i}
    answers_per_prompt: int = 1  # the greedy answer, then sampled ones: more of the model's own text
    sample_temperature: float = 0.8
    answers_file: str | None = None  # read the answers from here if it exists, else write them (own_answers)
    head_layers: int = 1  # residual layers per head (Hydra++ found deeper heads better)


@dataclass
class MedusaTrainReport:
    config: dict
    num_sequences: int = 0
    num_generated_tokens: int = 0
    num_train_positions: int = 0
    steps: int = 0
    generate_s: float = 0.0
    answers_read: bool = False  # the answers came from cfg.answers_file (generate_s is then 0)
    hidden_s: float = 0.0
    train_s: float = 0.0
    loss_curve: list[tuple[int, float]] = field(default_factory=list)  # (step, mean loss over heads)
    holdout_top1: list[float] = field(default_factory=list)  # per head
    holdout_chain_acceptance: list[float] = field(default_factory=list)  # P(heads 1..i all right)
    holdout_untrained_top1: list[float] = field(default_factory=list)  # zero-init heads: the LM head's t+1 guess


def generate(model, tokenizer, eos_ids, prompts: list[list[int]], max_new_tokens: int, answers_per_prompt: int = 1,
             temperature: float = 0.8, seed: int = 0) -> list[tuple[list[int], int]]:
    """(prompt + answer, prompt length) per prompt and answer, through the engine: answer 0 of every prompt
    first (greedy), then answer j of every prompt, sampled at `temperature` with a seed per request, so
    that seqs[j * len(prompts) + i] is prompt i's answer j."""
    from minillm.engine.config import EngineConfig
    from minillm.engine.llm_engine import LLMEngine
    from minillm.sampling_params import SamplingParams

    e = LLMEngine(model, tokenizer, eos_ids, EngineConfig(max_num_seqs=32, max_num_batched_tokens=2048,
                                                          kv_cache_memory_bytes=256 << 20))
    n = len(prompts)
    for j in range(answers_per_prompt):
        for i, p in enumerate(prompts):
            sp = (SamplingParams(temperature=0.0, max_tokens=max_new_tokens) if j == 0 else
                  SamplingParams(temperature=temperature, max_tokens=max_new_tokens, seed=seed * 1_000_003 + j * n + i))
            e.add_request(str(j * n + i), p, sp)
    done = {}
    while e.has_unfinished_requests():
        for out in e.step():
            if out.finished:
                done[int(out.request_id)] = out.outputs[0].token_ids
    return [(prompts[r % n] + done[r], len(prompts[r % n])) for r in range(n * answers_per_prompt)]


ANSWER_SETTINGS = ("num_chat_prompts", "num_topic_questions", "num_general_questions", "passage_chars",
                   "max_new_tokens", "answers_per_prompt", "sample_temperature", "seed")


def own_answers(model, tokenizer, eos_ids, cfg, report, log) -> list[tuple[list[int], int]]:
    """The training prompts (cfg's counts) answered by the model itself: each greedily once, and
    cfg.answers_per_prompt - 1 more times sampled at cfg.sample_temperature (more text of the model's
    own, for the same prompts); fills report's generate_s, num_sequences and num_generated_tokens
    (Medusa's and EAGLE's training share it). Laid out as `generate` says.

    With cfg.answers_file set, the answers are read from that file when it exists (written by an earlier
    run with the same settings on the same base model; anything else is an error, never a silent reuse)
    and written there otherwise: generation is most of a run's time, and Medusa, Hydra and EAGLE runs
    can share one."""
    path = cfg.answers_file
    settings = {k: getattr(cfg, k) for k in ANSWER_SETTINGS}
    made_in_s = None
    if path and Path(path).is_file():
        seqs, made_in_s = read_answers(path, settings, embedding_fingerprint(model))
        report.answers_read = True  # this run's generate_s stays 0: it generated nothing
    else:
        t0 = time.perf_counter()
        prompts = training_prompts(tokenizer, cfg.num_chat_prompts, cfg.num_topic_questions, cfg.num_general_questions,
                                   cfg.passage_chars, cfg.seed)
        seqs = generate(model, tokenizer, eos_ids, prompts, cfg.max_new_tokens, cfg.answers_per_prompt,
                        cfg.sample_temperature, cfg.seed)
        report.generate_s = time.perf_counter() - t0
        if path:
            write_answers(path, settings, embedding_fingerprint(model), seqs, report.generate_s)
    report.num_sequences = len(seqs)
    report.num_generated_tokens = sum(len(ids) - p for ids, p in seqs)
    if report.answers_read:
        log(f"read {len(seqs)} answers from {path} ({report.num_generated_tokens} generated tokens; "
            f"their generation took {made_in_s:.0f} s)")
    else:
        log(f"generated {report.num_generated_tokens} tokens in {len(seqs)} answers ({report.generate_s:.0f} s)")
    return seqs


def write_answers(path, settings: dict, fingerprint: str, seqs: list[tuple[list[int], int]], generate_s: float) -> None:
    """The generated answers as JSON: the settings that made them, the base model's fingerprint, and
    [token ids, prompt length] per sequence (a few MB for 1,000 answers)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    part = Path(f"{path}.part")  # renamed when whole: an interrupted run leaves no half file to be read later
    with open(part, "w") as f:
        json.dump({"settings": settings, "base_fingerprint": fingerprint, "generate_s": generate_s,
                   "seqs": [[ids, plen] for ids, plen in seqs]}, f)
    part.replace(path)


def read_answers(path, settings: dict, fingerprint: str) -> tuple[list[tuple[list[int], int]], float]:
    """(write_answers' sequences, the seconds their generation took), after checking that this base model
    made them with these settings."""
    try:
        with open(path) as f:
            data = json.load(f)
        seqs = [(list(ids), int(plen)) for ids, plen in data["seqs"]]
        saved, saved_fp, made_in_s = data["settings"], data["base_fingerprint"], float(data["generate_s"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a readable answers file ({type(e).__name__}: {e})") from e
    if saved_fp != fingerprint:
        raise ValueError(f"{path}: answers of another base model (embedding fingerprint {saved_fp}, this one's {fingerprint})")
    differ = {k: (saved.get(k), v) for k, v in settings.items() if saved.get(k) != v}
    if differ:
        raise ValueError(f"{path}: answers made with other settings: "
                         + ", ".join(f"{k} {a!r} in the file, {b!r} here" for k, (a, b) in differ.items()))
    return seqs, made_in_s


def split_by_prompt(num_seqs: int, answers_per_prompt: int, holdout: float,
                    rng: random.Random) -> tuple[list[int], list[int]]:
    """(train, held-out) indices into own_answers' sequences. A held-out prompt's answers are all kept out
    of training (a sampled answer to the same question would leak), and only its greedy answer is
    scored: at temperature 0 the heads guess greedy text. rng: the run's own stream (one shuffle)."""
    n = num_seqs // answers_per_prompt
    order = list(range(n))
    rng.shuffle(order)
    n_hold = max(1, int(n * holdout))
    return [j * n + i for j in range(answers_per_prompt) for i in order[n_hold:]], order[:n_hold]


def check_answer_settings(cfg) -> None:
    """Reject bad generation settings before minutes of generation."""
    if cfg.answers_per_prompt < 1:
        raise ValueError(f"answers_per_prompt must be >= 1, got {cfg.answers_per_prompt}")
    if cfg.answers_per_prompt > 1 and not cfg.sample_temperature > 0:
        raise ValueError(f"sampled answers need sample_temperature > 0, got {cfg.sample_temperature}")


@torch.inference_mode()
def final_hidden(model, ids: list[int]) -> torch.Tensor:
    """The base model's final-norm hidden state at every position of one sequence."""
    from minillm.attention.metadata import AttentionMetadata
    from minillm.models.standalone import attach_private_cache

    n = len(ids)
    table = attach_private_cache(model, n, 16, None)
    dev = model.embed_tokens.weight.device
    meta = AttentionMetadata.build([n], [n], [table], 16, dev)
    return model(torch.tensor(ids, device=dev), torch.arange(n, device=dev), meta).float()


def head_targets(seqs: list[tuple[list[int], int]], hiddens: list[torch.Tensor], num_heads: int,
                 with_next: bool = False):
    """(h_t, [token t+1, ..., t+K+1]) for every generated position with all K targets inside the sequence:
    head i's target is column i (x_{t+i+1}); a Hydra head also reads columns 0 .. i-1. with_next: also
    [h_{t+1}, ..., h_{t+K}] per position ([rows, K, hidden]), the base model's own states for those guesses."""
    hs, ys, nexts = [], [], []
    for (ids, plen), h in zip(seqs, hiddens):
        ids_t = torch.tensor(ids)
        last = len(ids) - 2 - num_heads  # t + 1 + K <= len - 1
        first = max(plen - 1, 0)  # h_{plen-1} predicts the first generated token: inside the answer from here
        if last < first:
            continue
        t = torch.arange(first, last + 1)
        hs.append(h[t])
        ys.append(torch.stack([ids_t[t + 1 + i] for i in range(num_heads + 1)], dim=1))
        if with_next:
            nexts.append(torch.stack([h[t + i] for i in range(1, num_heads + 1)], dim=1))
    if not hs:
        empty = torch.empty(0), torch.empty(0, num_heads + 1, dtype=torch.long)
        return (*empty, torch.empty(0, num_heads, 0)) if with_next else empty
    if with_next:
        return torch.cat(hs), torch.cat(ys), torch.cat(nexts)
    return torch.cat(hs), torch.cat(ys)


def head_states(model, heads: MedusaHeads, h: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    """[K, rows, hidden]: each head's state; window [rows, K + 1] from head_targets."""
    if isinstance(heads, HydraHeads):
        return heads(h, model.embed_tokens(window[:, :-1].t()).to(h.dtype))
    return heads(h)


def lm_logits(model, x: torch.Tensor) -> torch.Tensor:
    """States through the frozen LM head, float32 logits."""
    return model.lm_head(x.to(model.lm_head.weight.dtype)).float() if isinstance(model.lm_head, nn.Linear) \
        else model.compute_logits(x)


def head_logits(model, heads: MedusaHeads, h: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    """[K, rows, vocab] through the frozen LM head; window [rows, K + 1] from head_targets."""
    return lm_logits(model, head_states(model, heads, h, window))


def head_loss(model, heads: MedusaHeads, cfg: "MedusaTrainConfig", h: torch.Tensor, y: torch.Tensor,
              h_next: torch.Tensor | None) -> torch.Tensor:
    """The training loss of one batch: cross-entropy on the tokens (or, with cfg.distill, on the base model's
    distribution at t + i), plus cfg.feature_weight x smooth L1 of each head's state against h_{t+i}."""
    z = head_states(model, heads, h, y)  # [K, b, hidden]
    logits = lm_logits(model, z)
    vocab = logits.shape[-1]
    if cfg.distill:
        with torch.no_grad():  # the teacher: the frozen base model's own next-token distribution
            teacher = lm_logits(model, h_next.transpose(0, 1)).softmax(-1)
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), teacher.reshape(-1, vocab))
    else:
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), y[:, 1:].t().reshape(-1))
    if cfg.feature_weight:
        loss = loss + cfg.feature_weight * nn.functional.smooth_l1_loss(z.float(), h_next.transpose(0, 1).float())
    return loss


def evaluate(model, heads: MedusaHeads, h: torch.Tensor, y: torch.Tensor, batch: int = 512) -> tuple[list[float], list[float]]:
    """Per head top-1 accuracy, and the chance that heads 1..i are all right (a chain's acceptance; for
    Hydra heads, teacher-forced is exact here: head i's guess counts only where heads 1..i-1 were right)."""
    right = []
    with torch.no_grad():
        for s in range(0, h.shape[0], batch):
            w = y[s : s + batch]
            right.append(head_logits(model, heads, h[s : s + batch], w).argmax(-1).t() == w[:, 1:])
    if not right:
        return [], []
    r = torch.cat(right).float()  # [rows, K]
    return r.mean(0).tolist(), r.cumprod(1).mean(0).tolist()


def optimise(module: nn.Module, epoch_losses, epochs: int, num_batches: int, lr: float, weight_decay: float,
             max_seconds: float | None, report, log) -> None:
    """AdamW with a one-cycle schedule over `epochs` passes of epoch_losses() (a generator of batch losses,
    shuffled anew each call); fills report.loss_curve (every 10 steps), report.steps and report.train_s."""
    opt = torch.optim.AdamW(module.parameters(), lr=lr, weight_decay=weight_decay)
    total_steps = max(1, epochs * num_batches)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=total_steps, pct_start=0.1)
    t0 = time.perf_counter()
    step, running = 0, []
    for epoch in range(epochs):
        for loss in epoch_losses():
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            running.append(float(loss.detach()))
            if step % 10 == 0 or step == total_steps:
                report.loss_curve.append((step, sum(running) / len(running)))
                running = []
                log(f"epoch {epoch} step {step}/{total_steps} loss {report.loss_curve[-1][1]:.3f}")
            if max_seconds is not None and time.perf_counter() - t0 > max_seconds:
                break
        else:
            continue
        break
    report.steps = step
    report.train_s = time.perf_counter() - t0


def train_heads(model, tokenizer, eos_ids, cfg: MedusaTrainConfig, log=print) -> tuple[MedusaHeads, MedusaTrainReport]:
    if cfg.kind not in KINDS:  # before minutes of generation
        raise ValueError(f"kind must be one of {sorted(KINDS)}, got {cfg.kind!r}")
    if not cfg.feature_weight >= 0:
        raise ValueError(f"feature_weight must be >= 0, got {cfg.feature_weight}")
    check_answer_settings(cfg)
    if cfg.head_layers < 1:
        raise ValueError(f"head_layers must be >= 1, got {cfg.head_layers}")
    torch.manual_seed(cfg.seed)
    report = MedusaTrainReport(asdict(cfg))
    seqs = own_answers(model, tokenizer, eos_ids, cfg, report, log)
    t0 = time.perf_counter()
    train_idx, hold_idx = split_by_prompt(len(seqs), cfg.answers_per_prompt, cfg.holdout, random.Random(cfg.seed))
    train, hold = [seqs[i] for i in train_idx], [seqs[i] for i in hold_idx]
    with_next = cfg.distill or bool(cfg.feature_weight)
    h_tr, y_tr, *n_tr = head_targets(train, [final_hidden(model, ids) for ids, _ in train], cfg.num_heads, with_next)
    h_ho, y_ho = head_targets(hold, [final_hidden(model, ids) for ids, _ in hold], cfg.num_heads)[:2]
    report.hidden_s = time.perf_counter() - t0
    report.num_train_positions = int(h_tr.shape[0])
    log(f"{h_tr.shape[0]} training positions, {h_ho.shape[0]} held out ({report.hidden_s:.0f} s of prefill)")

    heads = KINDS[cfg.kind](model.config.hidden_size, cfg.num_heads, cfg.head_layers)
    for p in model.parameters():
        p.requires_grad_(False)
    num_batches = -(-h_tr.shape[0] // cfg.batch_positions)

    def epoch_losses():
        perm = torch.randperm(h_tr.shape[0])
        for s in range(0, h_tr.shape[0], cfg.batch_positions):
            idx = perm[s : s + cfg.batch_positions]
            yield head_loss(model, heads, cfg, h_tr[idx], y_tr[idx], n_tr[0][idx] if n_tr else None)

    optimise(heads, epoch_losses, cfg.epochs, num_batches, cfg.lr, cfg.weight_decay, cfg.max_train_seconds, report, log)
    heads.eval()
    report.holdout_top1, report.holdout_chain_acceptance = evaluate(model, heads, h_ho, y_ho)
    report.holdout_untrained_top1, _ = evaluate(model, KINDS[cfg.kind](model.config.hidden_size, cfg.num_heads,
                                                                       cfg.head_layers),
                                                h_ho, y_ho)
    log("held-out top-1 per head: " + ", ".join(f"{a:.2f}" for a in report.holdout_top1)
        + "; chain: " + ", ".join(f"{a:.2f}" for a in report.holdout_chain_acceptance))
    heads.metadata = {"base_fingerprint": embedding_fingerprint(model), "report": json.dumps(asdict(report))}
    return heads, report
