"""kvcxl.qemu"""
