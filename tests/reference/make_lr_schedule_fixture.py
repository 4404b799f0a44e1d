#!/usr/bin/env python3
"""Generate tests/reference/fixtures/lr_schedules.h5: the learning rate of every step of WSD and of
DeepSpeed's schedules (WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest), as a
training loop applies them.

WSD comes from transformers itself (get_wsd_schedule, a LambdaLR). DeepSpeed's are written below
from deepspeed/runtime/lr_schedules.py (DeepSpeed is not installed here): their constructors set the
first step's learning rate, and DeepSpeed's engine calls step() after each optimizer step, so step k
runs with get_lr() at last_batch_iteration = k - 1. Each schedule drives a
real torch optimizer, and the lr it holds at each optimizer.step() is what is stored.

Layout: one group per case, attrs scheduler_json (the DeepSpeed-style "scheduler" section as
so_train reads it) and lr (optimizer.params.lr); datasets lr [STEPS] and betas [STEPS, 2] float64
(the optimizer's (0.9, 0.999) unless the schedule sets them: OneCycle's cycle_momentum).

Usage (from the repository root, with the project's Python, $SO_PYTHON):
    python tests/reference/make_lr_schedule_fixture.py [--out tests/reference/fixtures/lr_schedules.h5]
"""
import json
import math

import numpy as np
import torch
import transformers

from fixture_file import create_fixture, fixture_out

STEPS = 120  # past the end of every schedule: the tails are compared too


class OneCycle:
    """DeepSpeed's OneCycle (momentum decay left out: so_train refuses a non-zero decay_mom_rate)."""

    def __init__(self, optimizer, cycle_min_lr, cycle_max_lr, decay_lr_rate=0.0, cycle_first_step_size=2000,
                 cycle_second_step_size=None, decay_step_size=0, cycle_momentum=True, cycle_min_mom=0.8,
                 cycle_max_mom=0.9, last_batch_iteration=-1):
        self.optimizer = optimizer
        first = float(cycle_first_step_size)
        second = float(cycle_second_step_size) if cycle_second_step_size is not None else first
        self.total_size = first + second
        self.step_ratio = first / self.total_size
        self.decay_step_size = decay_step_size
        self.skip_lr_decay = math.isclose(decay_step_size, 0)
        self.min_lrs = [cycle_min_lr] * len(optimizer.param_groups)
        self.max_lrs = [cycle_max_lr] * len(optimizer.param_groups)
        self.decay_lr_rate = decay_lr_rate
        if last_batch_iteration == -1:
            for lr, group in zip(self.min_lrs, optimizer.param_groups):
                group["lr"] = lr
        self.cycle_momentum = cycle_momentum and "betas" in optimizer.defaults
        if self.cycle_momentum:
            self.min_moms = [(cycle_min_mom, 0.99)] * len(optimizer.param_groups)
            self.max_moms = [(cycle_max_mom, 0.99)] * len(optimizer.param_groups)
            if last_batch_iteration == -1:
                for momentum, group in zip(self.min_moms, optimizer.param_groups):
                    group["betas"] = momentum
        self.last_batch_iteration = last_batch_iteration

    def get_mom(self):
        if self.last_batch_iteration < self.total_size:
            scale = self._get_scale_factor()
            return [(hi[0] - (hi[0] - lo[0]) * scale, lo[1]) for lo, hi in zip(self.min_moms, self.max_moms)]
        return self.max_moms

    def _get_scale_factor(self):
        batch_iteration = self.last_batch_iteration + 1
        cycle = math.floor(1 + batch_iteration / self.total_size)
        x = 1.0 + batch_iteration / self.total_size - cycle
        if x <= self.step_ratio:
            return x / self.step_ratio
        return (x - 1) / (self.step_ratio - 1)

    def get_lr(self):
        if self.last_batch_iteration < self.total_size:
            scale = self._get_scale_factor()
            return [lo + (hi - lo) * scale for lo, hi in zip(self.min_lrs, self.max_lrs)]
        if self.skip_lr_decay:
            return self.min_lrs
        decay_interval = (self.last_batch_iteration - self.total_size + 1) / self.decay_step_size
        return [lo / (1 + self.decay_lr_rate * decay_interval) for lo in self.min_lrs]

    def step(self):
        self.last_batch_iteration += 1
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            group["lr"] = lr
        if self.cycle_momentum:
            for group, momentum in zip(self.optimizer.param_groups, self.get_mom()):
                group["betas"] = momentum


class _Warmup:
    """What DeepSpeed's warmup schedules share: the iteration count, the warmup's length (at least 2)
    and its shape ("log" or "linear"), and setting the first group's lr from get_lr()."""

    def __init__(self, optimizer, warmup_num_steps, warmup_type, total_num_steps, last_batch_iteration):
        self.optimizer = optimizer
        self.warmup_num_steps = max(2, warmup_num_steps)
        self.warmup_type = warmup_type
        self.inverse_log_warm_up = 1.0 / math.log(self.warmup_num_steps)
        self.total_num_steps = total_num_steps
        self.last_batch_iteration = last_batch_iteration

    def warmup_fraction(self):  # 0 -> 1 over the warmup
        if self.warmup_type == "log":
            return self.inverse_log_warm_up * math.log(self.last_batch_iteration + 1)
        return self.last_batch_iteration / self.warmup_num_steps

    def step(self):
        self.last_batch_iteration += 1
        self.optimizer.param_groups[0]["lr"] = self.get_lr()


class WarmupLR(_Warmup):
    """DeepSpeed's WarmupLR and, with total_num_steps, WarmupDecayLR."""

    def __init__(self, optimizer, warmup_min_lr=0.0, warmup_max_lr=0.001, warmup_num_steps=1000,
                 warmup_type="log", total_num_steps=None, last_batch_iteration=-1):
        super().__init__(optimizer, warmup_num_steps, warmup_type, total_num_steps, last_batch_iteration)
        self.min_lr, self.max_lr = warmup_min_lr, warmup_max_lr
        if last_batch_iteration == -1:
            optimizer.param_groups[0]["lr"] = self.get_lr()

    def gamma(self):
        if self.last_batch_iteration < self.warmup_num_steps:
            return self.warmup_fraction()
        if self.total_num_steps is None:
            return 1.0
        return max(0.0, float(self.total_num_steps - self.last_batch_iteration) /
                   float(max(1.0, self.total_num_steps - self.warmup_num_steps)))

    def get_lr(self):
        if self.last_batch_iteration < 0:
            return self.min_lr
        return self.min_lr + (self.max_lr - self.min_lr) * self.gamma()


class WarmupCosineLR(_Warmup):
    """DeepSpeed's WarmupCosineLR: ratios of the optimizer's lr."""

    def __init__(self, optimizer, total_num_steps, warmup_min_ratio=0.0, warmup_num_steps=1000,
                 cos_min_ratio=0.0001, warmup_type="log", last_batch_iteration=-1):
        super().__init__(optimizer, warmup_num_steps, warmup_type, total_num_steps, last_batch_iteration)
        self.warmup_min_ratio, self.cos_min_ratio = warmup_min_ratio, cos_min_ratio
        self.org_lr = optimizer.param_groups[0]["lr"]
        if last_batch_iteration == -1:
            optimizer.param_groups[0]["lr"] = self.get_lr()

    def ratio(self):
        if self.last_batch_iteration < self.warmup_num_steps:
            return self.warmup_min_ratio + self.warmup_fraction() * (1.0 - self.warmup_min_ratio)
        real_last_step = self.last_batch_iteration - self.warmup_num_steps + 1
        real_total_steps = self.total_num_steps - self.warmup_num_steps
        r = (1 + math.cos(math.pi * real_last_step / real_total_steps)) / 2
        return max(0.0, self.cos_min_ratio + (1.0 - self.cos_min_ratio) * r)

    def get_lr(self):
        if self.last_batch_iteration < 0:
            return 0.0
        return self.org_lr * self.ratio()


class LRRangeTest:
    """DeepSpeed's LRRangeTest."""

    def __init__(self, optimizer, lr_range_test_min_lr=1e-3, lr_range_test_step_size=2000,
                 lr_range_test_step_rate=1.0, lr_range_test_staircase=False, last_batch_iteration=-1):
        self.optimizer = optimizer
        self.min_lr = [lr_range_test_min_lr] * len(optimizer.param_groups)
        self.step_size = lr_range_test_step_size
        self.step_rate = lr_range_test_step_rate
        self.staircase = lr_range_test_staircase
        self.last_batch_iteration = last_batch_iteration
        if last_batch_iteration == -1:
            for lr, group in zip(self.min_lr, optimizer.param_groups):
                group["lr"] = lr

    def get_lr(self):
        interval = float(self.last_batch_iteration + 1) / self.step_size
        if self.staircase:
            interval = math.floor(interval)
        return [lo * (1 + self.step_rate * interval) for lo in self.min_lr]

    def step(self):
        self.last_batch_iteration += 1
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            group["lr"] = lr


CASES = {
    "wsd_linear_cosine_total": (3e-3, {"type": "WSD", "params": {
        "num_warmup_steps": 10, "num_decay_steps": 30, "num_training_steps": 100, "min_lr_ratio": 0.1}}),
    "wsd_cosine_linear_stable": (1e-3, {"type": "WSD", "params": {
        "num_warmup_steps": 7, "num_stable_steps": 50, "num_decay_steps": 40, "warmup_type": "cosine",
        "decay_type": "linear"}}),
    "wsd_1sqrt_1sqrt": (2e-4, {"type": "WSD", "params": {
        "num_warmup_steps": 12, "num_decay_steps": 25, "num_training_steps": 90, "warmup_type": "1-sqrt",
        "decay_type": "1-sqrt", "min_lr_ratio": 0.05}}),
    "wsd_cosine_quarter_no_warmup": (1e-2, {"type": "WSD", "params": {
        "num_warmup_steps": 0, "num_decay_steps": 60, "num_stable_steps": 20, "num_cycles": 0.25}}),
    "one_cycle_decay": (1.0, {"type": "OneCycle", "params": {
        "cycle_min_lr": 1e-4, "cycle_max_lr": 1e-2, "cycle_first_step_size": 20, "cycle_second_step_size": 30,
        "decay_step_size": 5, "decay_lr_rate": 0.1, "cycle_momentum": False}}),
    "one_cycle_symmetric_no_decay": (1.0, {"type": "OneCycle", "params": {
        "cycle_min_lr": 3e-4, "cycle_max_lr": 3e-3, "cycle_first_step_size": 25, "cycle_momentum": False}}),
    "one_cycle_momentum": (1.0, {"type": "OneCycle", "params": {  # cycle_momentum: DeepSpeed's default true
        "cycle_min_lr": 1e-4, "cycle_max_lr": 1e-2, "cycle_first_step_size": 15, "cycle_second_step_size": 25,
        "cycle_min_mom": 0.85, "cycle_max_mom": 0.95}}),
    "warmup_lr_log": (1.0, {"type": "WarmupLR", "params": {
        "warmup_min_lr": 1e-5, "warmup_max_lr": 3e-3, "warmup_num_steps": 20}}),
    "warmup_lr_linear_no_warmup": (1.0, {"type": "WarmupLR", "params": {
        "warmup_min_lr": 2e-4, "warmup_max_lr": 1e-3, "warmup_num_steps": 0, "warmup_type": "linear"}}),
    "warmup_decay_lr_linear": (1.0, {"type": "WarmupDecayLR", "params": {
        "warmup_min_lr": 1e-4, "warmup_max_lr": 2e-3, "warmup_num_steps": 15, "warmup_type": "linear",
        "total_num_steps": 100}}),
    "warmup_cosine_lr_log": (3e-3, {"type": "WarmupCosineLR", "params": {
        "warmup_num_steps": 12, "total_num_steps": 90, "warmup_min_ratio": 0.1, "cos_min_ratio": 0.05}}),
    "warmup_cosine_lr_linear": (1e-3, {"type": "WarmupCosineLR", "params": {
        "warmup_num_steps": 30, "warmup_type": "linear", "total_num_steps": 400, "cos_min_ratio": 0.1}}),
    "range_test_continuous": (1.0, {"type": "LRRangeTest", "params": {
        "lr_range_test_min_lr": 1e-4, "lr_range_test_step_size": 10, "lr_range_test_step_rate": 0.5}}),
    "range_test_staircase": (1.0, {"type": "LRRangeTest", "params": {
        "lr_range_test_min_lr": 2e-5, "lr_range_test_step_size": 7, "lr_range_test_step_rate": 2.0,
        "lr_range_test_staircase": True}}),
}


def scheduler(optimizer, section):
    p = dict(section["params"])
    if section["type"] == "WSD":
        return transformers.get_wsd_schedule(optimizer, **p)
    if section["type"] in ("WarmupLR", "WarmupDecayLR"):
        return WarmupLR(optimizer, **p)
    if section["type"] == "WarmupCosineLR":
        return WarmupCosineLR(optimizer, **p)
    return (OneCycle if section["type"] == "OneCycle" else LRRangeTest)(optimizer, **p)


def run(base_lr, section):
    """The lr and betas each optimizer step runs with."""
    w = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([w], lr=base_lr, betas=(0.9, 0.999))
    sched = scheduler(opt, section)
    lr, betas = [], []
    for _ in range(STEPS):
        lr.append(opt.param_groups[0]["lr"])
        betas.append(opt.param_groups[0]["betas"])
        w.grad = torch.zeros(1)
        opt.step()
        sched.step()
    return np.asarray(lr, np.float64), np.asarray(betas, np.float64)


def main():
    out = fixture_out(__doc__, "lr_schedules.h5")
    with create_fixture(out, transformers) as f:
        for name, (base_lr, section) in CASES.items():
            g = f.create_group(name)
            g.attrs["scheduler_json"] = json.dumps(section)
            g.attrs["lr"] = float(base_lr)
            g["lr"], g["betas"] = run(base_lr, section)
    print(f"wrote {out}: {len(CASES)} schedules x {STEPS} steps")


if __name__ == "__main__":
    main()
