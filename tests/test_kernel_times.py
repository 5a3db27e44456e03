"""tools/kernel_times.py's table names each kernel so that a line of it reads: Triton kernels as they are, torch's
demangled C++ kernels by their own name and the function they were instantiated for."""

from __future__ import annotations

from scripts_helpers import load_script


def test_kernel_names_are_short_and_still_tell_torchs_kernels_apart():
    short = load_script("tools/kernel_times.py").short_name
    convert = (
        "void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda("
        "at::TensorIteratorBase&)::{lambda(float)#1}, std::array<char*, 2ul> >(int, at::native::"
        "bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda(float)#1}, std::array<char*, 2ul>)"
    )
    assert short(convert) == "vectorized_elementwise_kernel<bfloat16_copy_kernel_cuda>"
    fill = convert.replace("bfloat16_copy_kernel_cuda", "fill_kernel_cuda")
    assert short(fill) == "vectorized_elementwise_kernel<fill_kernel_cuda>"
    assert short("void at::native::(anonymous namespace)::cat_kernel(float*, int)") == "cat_kernel"
    for name in (
        "_bwd_dkdv_ws",
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_kernel0_0",
    ):
        assert short(name) == name
