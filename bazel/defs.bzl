"""duet's build macros: tests on the shared Catch2 main, CUDA objects via nvcc."""

load("@rules_cc//cc:defs.bzl", "cc_library", "cc_test")

_CUDA_ONLY = select({
    "//bazel:cuda_enabled": [],
    "//conditions:default": ["//bazel:never"],
})

def duet_cc_test(name, srcs, deps = [], gpu = False, tags = [], data = [], size = "small", **kwargs):
    """A Catch2 test linked with the shared main.

    gpu = True tags it `gpu` (CI filters those out) and builds it only under
    --config=cuda. Run without a device, a GPU test fails; it never skips.
    """
    cc_test(
        name = name,
        srcs = srcs,
        deps = deps + ["//bazel:catch2_main"],
        tags = tags + (["gpu"] if gpu else []),
        data = data,
        size = size,
        target_compatible_with = _CUDA_ONLY if gpu else [],
        **kwargs
    )

_NVCC = "/usr/local/cuda/bin/nvcc"
_NVCC_FLAGS = " ".join([
    "-std=c++17",
    "-O3",
    "-gencode arch=compute_80,code=sm_80",
    "-gencode arch=compute_90,code=sm_90",
    "-Xcompiler -fPIC",
    "-I.",
    "-I$(GENDIR)",
])

def cuda_library(name, srcs, hdrs = [], deps = [], visibility = None):
    """Compiles each .cu with nvcc (sm_80, sm_90) and wraps the objects in a
    cc_library linked with cudart, cuBLAS and NCCL. Built only under --config=cuda."""
    objs = []
    for src in srcs:
        base = src[:-len(".cu")].replace("/", "_")
        obj = "_" + name + "_" + base + ".pic.o"
        native.genrule(
            name = "_" + name + "_" + base + "_nvcc",
            srcs = [src] + hdrs,
            outs = [obj],
            cmd = _NVCC + " " + _NVCC_FLAGS + " -c $(location " + src + ") -o $@",
            target_compatible_with = _CUDA_ONLY,
        )
        objs.append(obj)
    cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["//bazel:cuda_runtime"],
        target_compatible_with = _CUDA_ONLY,
        visibility = visibility,
    )
