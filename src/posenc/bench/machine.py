"""What a timing was measured on: ratios move between CPU models (RoPE apply was 2.7× ``copy_``
on one 2-core machine and 5.9× on another), so every table names the machine."""

from __future__ import annotations

import os

import torch

from ..lm.runtime import cpu_model


def describe(device: str = "cpu") -> dict:
    """{cpu, cores, threads, cpu_capability, torch, device[, gpu]}: the facts a table's ratios depend on."""
    facts = {"cpu": cpu_model(), "cores": os.cpu_count(), "threads": torch.get_num_threads(),
             "cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__, "device": device}
    if device.startswith("cuda") and torch.cuda.is_available():
        facts["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return facts


def one_line(facts: dict) -> str:
    gpu = f", GPU {facts['gpu']}" if "gpu" in facts else ""
    return (f"{facts['cpu']} ({facts['cores']} cores, {facts['threads']} threads, {facts['cpu_capability']}){gpu}, "
            f"torch {facts['torch']}, device {facts['device']}")
