"""Build rules of the GPU transport tests: each runs against
//kvtransfer/testing:gpu_peer and links only the CUDA libraries it uses."""

load("//bazel:defs.bzl", "duet_cc_test")

# For the GPU binaries: record only the CUDA libraries they use (cudart, and
# NCCL where the NCCL transport is linked), not all of //bazel:cuda_runtime's.
# cuBLAS and NCCL are over 250 MB and would otherwise have to be found on the
# GPU machine (tools/gpu_check.sh). Only safe with linkstatic: gold's
# --as-needed ignores references from shared libraries, so Bazel's
# per-library .so files would lose their abseil dependencies.
LINK_USED_CUDA_LIBS_ONLY = ["-Wl,--as-needed"]

def gpu_transport_test(name, srcs, deps = []):
    """A transport's GPU test (Catch2, tagged gpu, built only under
    --config=cuda): gpu_peer is its exporter, gpu_fixture its checks and
    device buffers; deps add the transport under test."""
    duet_cc_test(
        name = name,
        size = "medium",
        srcs = srcs,
        data = ["//kvtransfer/testing:gpu_peer"],
        gpu = True,
        linkopts = LINK_USED_CUDA_LIBS_ONLY,
        linkstatic = True,
        deps = deps + [
            "//bazel:absl",
            "//bazel:cuda_runtime",
            "//kvtransfer:transport",
            "//kvtransfer/testing:gpu_fixture",
        ],
    )
