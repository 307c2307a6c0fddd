"""kvcxl.rtl"""
