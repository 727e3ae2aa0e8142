// The part of libtorch posenc's C++ kernels use: tensors, type dispatch, parallel_for, four factory functions and
// pybind11's tensor casters. <torch/extension.h> (the whole C++ frontend) took 28 of a kernel's 35 s to compile;
// these headers take about 9.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <torch/csrc/utils/pybind.h>
