"""kvcxl.emu"""

from kvcxl.common.meminfo import no_huge_page_stalls

no_huge_page_stalls()  # (this part allocates the large arrays: streams, replays, tiers)
