"""Step-through controller: Step, Run/Pause and a slider over the recorded steps.

It drives a real LLMEngine (`engine.step()`); listeners get the step index
the cursor points at and read `engine.trace` themselves. Run is an asyncio
task on the kernel's event loop that yields between steps, so the page stays
responsive and Pause (or the slider) works while it runs.
"""
from __future__ import annotations

import asyncio
import time
from typing import Callable

import ipywidgets as w


class StepController:
    def __init__(self, engine=None, trace: list | None = None, interval_s: float = 0.05,
                 min_frame_s: float = 0.25) -> None:
        self.engine = getattr(engine, "engine", engine)  # an LLM or an LLMEngine
        self._trace = trace
        self.interval_s = interval_s
        self.min_frame_s = min_frame_s
        self.listeners: list[Callable[[int], None]] = []
        self._task: asyncio.Task | None = None
        self._moving = False  # the slider is being moved by code, not by the reader
        self._setting_button = False  # the Run button is being flipped by code
        self._stop = False
        live = self.engine is not None
        self.step_button = w.Button(description="Step", icon="step-forward", disabled=not live,
                                    tooltip="run one engine step")
        self.run_button = w.ToggleButton(description="Run", icon="play", disabled=not live,
                                         tooltip="step until the engine has no work (click again to pause)")
        self.slider = w.IntSlider(value=0, min=0, max=0, description="step", continuous_update=True,
                                  layout=w.Layout(width="420px"))
        self.status = w.HTML()
        self.step_button.on_click(lambda _: self.step())
        self.run_button.observe(self._on_run_toggle, names="value")
        self.slider.observe(self._on_slider, names="value")
        self.widget = w.HBox([self.step_button, self.run_button, self.slider, self.status])
        self._sync_slider()

    @property
    def trace(self) -> list:
        return self.engine.trace if self.engine is not None else (self._trace or [])

    @property
    def has_work(self) -> bool:
        return self.engine is not None and self.engine.has_unfinished_requests()

    @property
    def cursor(self) -> int | None:
        return self.slider.value if self.trace else None

    def observe(self, fn: Callable[[int], None]) -> None:
        self.listeners.append(fn)

    # ----- moving the cursor ---------------------------------------------------
    def show(self, step: int) -> None:
        """Point every view at recorded step `step`."""
        if not self.trace:
            return
        step = max(0, min(step, len(self.trace) - 1))
        self._moving = True
        try:
            self.slider.value = step
        finally:
            self._moving = False
        self._notify(step)

    def _on_slider(self, change) -> None:
        if not self._moving and self.trace:
            self._notify(change["new"])

    def _notify(self, step: int) -> None:
        for fn in self.listeners:
            fn(step)
        self._update_status(step)

    def _sync_slider(self) -> None:
        self._moving = True
        try:
            self.slider.max = max(0, len(self.trace) - 1)
        finally:
            self._moving = False
        self._update_status(self.cursor)

    def _update_status(self, step: int | None) -> None:
        n = len(self.trace)
        where = "no steps recorded" if step is None else f"step {step} of {n - 1}"
        if self.engine is not None:
            last = self.trace[-1] if self.trace else None  # the trace, not the scheduler's internals
            if not self.has_work:
                # say why Step does nothing (a re-run dashboard cell on an engine that already finished)
                state = "no unfinished requests: Step and Run have nothing to do until requests are added"
            elif last is None:
                state = "requests queued: press Step or Run"
            else:
                state = f"after step {n - 1}: {last.num_running} running, {last.num_waiting} waiting"
            where += f" &middot; {state}"
        self.status.value = f"<span style='font-family:monospace'>{where}</span>"

    # ----- driving the engine --------------------------------------------------
    def step(self, n: int = 1, render: bool = True) -> int:
        """Run up to `n` engine steps (fewer if the engine runs out of work); returns how many ran."""
        done = 0
        if self.has_work and hasattr(self.engine, "executor"):
            # several engines may share one model (the notebooks build a few): point its
            # attention layers at this engine's KV pool before stepping it
            self.engine.executor.attach()
        while done < n and self.has_work:
            self.engine.step()
            done += 1
        self._sync_slider()
        if render and self.trace:
            self.show(len(self.trace) - 1)
        return done

    async def run(self, max_steps: int | None = None) -> int:
        """Step until paused, out of work, or `max_steps`; yields to the event loop between steps."""
        done = 0
        self._stop = False
        self._set_run_button(True)
        try:
            last_draw = 0.0
            while not self._stop and self.has_work and (max_steps is None or done < max_steps):
                # redraw at most every min_frame_s: a real step can be faster than drawing three figures
                draw = time.perf_counter() - last_draw >= self.min_frame_s
                self.step(render=draw)
                if draw:
                    last_draw = time.perf_counter()
                done += 1
                await asyncio.sleep(self.interval_s)  # lets the kernel handle clicks (Pause, slider)
        finally:
            self._set_run_button(False)
            if self.trace:
                self.show(len(self.trace) - 1)
        return done

    def _set_run_button(self, running: bool) -> None:
        self._setting_button = True
        try:
            self.run_button.value = running
            self.run_button.description, self.run_button.icon = ("Pause", "pause") if running else ("Run", "play")
        finally:
            self._setting_button = False

    def _on_run_toggle(self, change) -> None:
        if self._setting_button:
            return
        if change["new"]:
            if self._task is None or self._task.done():
                self._task = asyncio.ensure_future(self.run())
        else:
            self._stop = True  # run() stops after the step in progress

    def pause(self) -> None:
        self._stop = True
