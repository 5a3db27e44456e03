"""`sweep --ncu`: Nsight Compute's CSV (either page layout) summed into DRAM bytes per case."""

from __future__ import annotations

from flashbench.engine.ncu import parse_csv

RAW = """==PROF== Disconnected from process 1234
"ID","Process ID","Kernel Name","dram__bytes_read.sum","dram__bytes_write.sum"
"","","","byte","byte"
"0","1234","flash_fwd","1,048,576","524288"
"1","1234","flash_bwd","2000","1000"
"""

DETAILS = """"ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"
"0","k","Command line profiler metrics","dram__bytes_read.sum","Mbyte","1.50"
"0","k","Command line profiler metrics","dram__bytes_write.sum","Kbyte","2"
"1","k2","Command line profiler metrics","dram__bytes_read.sum","byte","500"
"""


def test_raw_page_sums_every_kernel_in_the_profiled_range():
    totals = parse_csv(RAW)
    assert totals == {"dram__bytes_read.sum": 1_050_576, "dram__bytes_write.sum": 525_288}


def test_details_page_converts_units():
    totals = parse_csv(DETAILS)
    assert totals["dram__bytes_read.sum"] == 1_500_500
    assert totals["dram__bytes_write.sum"] == 2_000


def test_empty_output_is_zero_not_an_error():
    assert parse_csv("") == {"dram__bytes_read.sum": 0.0, "dram__bytes_write.sum": 0.0}
