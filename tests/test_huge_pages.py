"""Weights moved into a huge-page mapping (minillm/cpu/huge_pages.py): same values, same objects, tied stays tied."""
import pytest
import torch
from torch import nn

from minillm.cpu import huge_pages
from minillm.cpu.huge_pages import huge_page_bytes_in, move_to_huge_pages, thp_mode
from minillm.roofline.roofs import probe_buffer

HAS_THP = thp_mode() in ("always", "madvise")


class Tiny(nn.Module):
    """Big enough to move (each tensor >= 64 KB): a tied embedding/head, a K-major linear, a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(512, 128)
        self.head = nn.Linear(128, 512, bias=False)
        self.head.weight = self.embed.weight
        self.body = nn.Linear(128, 256)
        self.body.weight = nn.Parameter(self.body.weight.detach().t().contiguous().t(), requires_grad=False)
        self.register_buffer("table", torch.randn(200, 100))
        self.norm = nn.Parameter(torch.ones(128))  # small: stays

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids) * self.norm
        return self.head(h) + self.body(h).sum(-1, keepdim=True) + self.table.sum()


@pytest.mark.skipif(not HAS_THP, reason=f"transparent huge pages: {thp_mode()}")
def test_move_keeps_values_objects_ties_and_strides():
    torch.manual_seed(0)
    m = Tiny()
    ids = torch.tensor([0, 7, 300, 511])
    before = m(ids)
    params = {n: p for n, p in m.named_parameters()}
    ptrs = {n: p.data_ptr() for n, p in params.items()}
    stride = m.body.weight.stride()
    report = move_to_huge_pages(m)
    assert report.tensors == 3 and report.bytes == (512 * 128 + 256 * 128 + 200 * 100) * 4  # embed/head once
    assert {n: p for n, p in m.named_parameters()} == params  # the same Parameter objects
    assert m.head.weight is m.embed.weight
    assert m.body.weight.stride() == stride == (1, 256)  # K-major stays K-major
    assert m.embed.weight.data_ptr() != ptrs["embed.weight"] and m.norm.data_ptr() == ptrs["norm"]
    assert huge_pages.in_huge_page_mapping(m.table)
    assert torch.equal(m(ids), before)
    again = move_to_huge_pages(m)  # a second engine on the same model moves nothing
    assert again.tensors == 0 and again.already == report.bytes
    assert m.embed.weight.data_ptr() != ptrs["embed.weight"]


@pytest.mark.skipif(not HAS_THP, reason=f"transparent huge pages: {thp_mode()}")
def test_large_weights_land_in_2mb_pages():
    m = nn.Linear(1024, 4096, bias=False)  # 16 MiB
    report = move_to_huge_pages(m)
    assert report.bytes == 16 << 20
    # the kernel may be short of free 2 MB pages; most of a fresh 16 MiB mapping gets them on a healthy machine
    assert report.huge_bytes >= 8 << 20, report
    assert huge_page_bytes_in([(m.weight.data_ptr(), m.weight.data_ptr() + (16 << 20))]) == report.huge_bytes


def test_switch_off_leaves_weights(monkeypatch):
    monkeypatch.setenv(huge_pages.HUGE_PAGES_ENV, "0")
    m = Tiny()
    ptr = m.embed.weight.data_ptr()
    report = move_to_huge_pages(m)
    assert report.tensors == 0 and "off" in str(report) and m.embed.weight.data_ptr() == ptr


def test_probe_buffer_is_ones():
    b = probe_buffer(3 << 20, torch.device("cpu"))
    assert b.dtype == torch.float32 and b.numel() == 3 << 20 and bool((b == 1).all())
    if HAS_THP:
        assert huge_pages.in_huge_page_mapping(b)


def test_collapse_in_place_keeps_values_and_addresses():
    ts = [torch.randn(2 << 20) for _ in range(3)] + [torch.randn(100_000) for _ in range(4)]  # 8 MiB and 400 KB
    before = [(t.data_ptr(), t.clone()) for t in ts]
    report = huge_pages.collapse_into_huge_pages(ts + ts[:1])  # a tensor named twice counts once
    assert all(t.data_ptr() == ptr and torch.equal(t, v) for t, (ptr, v) in zip(ts, before))
    if report.mode.startswith("unavailable"):
        pytest.skip(report.mode)
    assert report.tensors == 7 and report.bytes == (3 * (2 << 20) + 4 * 100_000) * 4
    assert "collapsed in place" in str(report)
    # each 2 MB chunk wholly inside the mapping collapses; at most the chunks at a mapping's ends may not
    assert report.huge_bytes >= report.bytes // 2, report


def test_collapse_switched_off(monkeypatch):
    monkeypatch.setenv(huge_pages.HUGE_PAGES_ENV, "0")
    assert huge_pages.collapse_into_huge_pages([torch.randn(1 << 20)]).tensors == 0


@pytest.mark.slow
def test_a_compiled_graphs_packed_weights_are_collapsed():
    # inductor's frozen graph multiplies its own packed copies of the weights (the generated module's
    # globals); frozen_compile collapses them into 2 MB pages as each graph is built
    from tests.helpers.engine_utils import greedy, run_to_completion, tiny_model
    from minillm.engine.config import EngineConfig
    from minillm.engine.llm_engine import LLMEngine

    model = tiny_model(heads=8, kv_heads=4, head_dim=32)  # every linear >= 64 KB
    eng = LLMEngine(model, None, [], EngineConfig(block_size=4, num_kv_blocks=64, compile=True,
                                                  cpu_decode_step=False))  # decode through the graphs
    eng.add_request("a", [5, 6, 7, 8, 9], greedy(6))
    run_to_completion(eng)
    reports = eng.executor.compiled_decode.constants_reports
    assert reports and reports[0].tensors > 0 and reports[0].action == "collapsed in place"
    if not reports[0].mode.startswith("unavailable"):
        assert reports[0].huge_bytes > 0
    assert eng.executor.fast_path.huge_pages.tensors > 0  # and the model's own weights were moved


def test_the_bench_json_says_what_this_process_moved():
    moved_before = huge_pages._done["moved"]
    m = nn.Linear(256, 256, bias=False)  # 256 KB
    report = move_to_huge_pages(m)
    state = huge_pages.huge_pages_state()
    assert state.startswith("transparent huge pages:") and "this process:" in state
    assert huge_pages._done["moved"] - moved_before == report.bytes
