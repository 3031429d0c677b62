"""duet's build macros: tests on the shared Catch2 main, CUDA objects via nvcc."""

load("@rules_cc//cc:defs.bzl", "cc_library", "cc_test")

_CUDA_ONLY = select({
    "//bazel:cuda_enabled": [],
    "//conditions:default": ["//bazel:never"],
})

# target_compatible_with for any target that needs CUDA, so that a plain
# `bazel build //...` skips it instead of failing.
CUDA_ONLY = _CUDA_ONLY

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

def duet_cc_test_library(name, **kwargs):
    """A library only tests, benches and test tools link (fixtures, fakes):
    testonly, so no production target can depend on it; the layering check
    counts it as test code."""
    cc_library(name = name, testonly = True, **kwargs)

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

_CUDA_INCLUDE = "/usr/local/cuda/include"

# <cuda_runtime_api.h> and what it includes (CUDA 13). g++ rejects an include
# path outside the execroot, so these are copied in as declared headers.
_CUDA_RUNTIME_HEADERS = [
    "builtin_types.h",
    "crt/host_defines.h",
    "cuda_device_runtime_api.h",
    "cuda_runtime_api.h",
    "device_types.h",
    "driver_types.h",
    "surface_types.h",
    "texture_types.h",
    "vector_types.h",
    # <cublas_v2.h> and what it includes (the CUDA backend's GEMM seam).
    "cuComplex.h",
    "cublas_api.h",
    "cublas_v2.h",
    "cuda_bf16.h",
    "cuda_bf16.hpp",
    "cuda_fp16.h",
    "cuda_fp16.hpp",
    "library_types.h",
    "nv/detail/__preprocessor",
    "nv/detail/__target_macros",
    "nv/target",
    "vector_functions.h",
    "vector_functions.hpp",
]

def cuda_runtime_headers():
    """Declares, once per package, :_cuda_runtime_headers, a cc_library that
    puts <cuda_runtime_api.h> (and <cublas_v2.h>) on the include path of
    everything above it."""
    name = "_cuda_runtime_headers"
    if native.existing_rule(name):
        return name
    outs = [name + "/" + h for h in _CUDA_RUNTIME_HEADERS]
    native.genrule(
        name = name + "_copy",
        outs = outs,
        cmd = " && ".join([
            "mkdir -p $$(dirname $(RULEDIR)/{o}) && cp {src}/{h} $(RULEDIR)/{o}".format(
                o = name + "/" + h,
                src = _CUDA_INCLUDE,
                h = h,
            )
            for h in _CUDA_RUNTIME_HEADERS
        ]),
        target_compatible_with = _CUDA_ONLY,
    )
    cc_library(
        name = name,
        hdrs = outs,
        includes = [name],
        target_compatible_with = _CUDA_ONLY,
    )
    return name

def cuda_library(name, srcs, hdrs = [], deps = [], visibility = None):
    """Compiles each .cu with nvcc (sm_80, sm_90) and wraps the objects in a
    cc_library linked with cudart, cuBLAS and NCCL. Built only under --config=cuda.

    hdrs are the .cuh launcher declarations, compiled by g++ in dependents; they
    may include <cuda_runtime_api.h>, which this library puts on its
    dependents' include path. A .cu sees only its own srcs and hdrs.
    """
    headers = cuda_runtime_headers()
    objs = []
    for src in srcs:
        base = src[:-len(".cu")].replace("/", "_")
        obj = "_" + name + "_" + base + ".pic.o"
        native.genrule(
            name = "_" + name + "_" + base + "_nvcc",
            srcs = [src] + hdrs,
            outs = [obj],
            # nvcc names its temporary files by its process id, which is the
            # same in every sandbox's PID namespace: concurrent compiles would
            # share /tmp's names, so each gets its own directory.
            cmd = ("t=$$(mktemp -d) && TMPDIR=$$t " + _NVCC + " " + _NVCC_FLAGS + " -c $(location " + src +
                   ") -o $@; rc=$$?; rm -rf $$t; exit $$rc"),
            target_compatible_with = _CUDA_ONLY,
        )
        objs.append(obj)
    cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + [":" + headers, "//bazel:cuda_runtime"],
        target_compatible_with = _CUDA_ONLY,
        visibility = visibility,
    )

def duet_cuda_kernels(name, srcs, hdrs, simt, deps = [], visibility = None):
    """CUDA kernels (each .cu with its .cuh launcher, which includes
    kernels/cuda/cuda_compat.h) built two ways from the same sources: `name`
    by nvcc (cuda_library; --config=cuda) and `name_simt` by g++ as host code
    on the SIMT executor (`simt`: its library's label), which every build has
    and CI runs. A `#line` keeps the .cu's own name in the SIMT build's
    messages."""
    cuda_library(name = name, srcs = srcs, hdrs = hdrs, deps = deps, visibility = visibility)
    wrappers = []
    for src in srcs:
        out = "_" + name + "_" + src[:-len(".cu")].replace("/", "_") + "_simt.cc"
        native.genrule(
            name = out[:-len(".cc")] + "_gen",
            srcs = [src],
            outs = [out],
            cmd = "(echo '#line 1 \"" + native.package_name() + "/" + src + "\"'; cat $(location " + src + ")) > $@",
        )
        wrappers.append(out)
    cc_library(
        name = name + "_simt",
        srcs = wrappers,
        hdrs = hdrs,
        deps = deps + [simt],
        visibility = visibility,
    )

def duet_proto_library(name, srcs, deps = [], visibility = None):
    """Generates C++ from .proto files with the system protoc (no download)
    and wraps it in a cc_library linked with Debian's libprotobuf."""
    outs = []
    for src in srcs:
        stem = src[:-len(".proto")]
        outs += [stem + ".pb.h", stem + ".pb.cc"]
    native.genrule(
        name = name + "_protoc",
        srcs = srcs,
        outs = outs,
        cmd = "protoc --proto_path=. --cpp_out=$(GENDIR) " + " ".join(["$(location %s)" % s for s in srcs]),
    )
    cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        deps = deps + ["//bazel:protobuf"],
        visibility = visibility,
    )
