"""kvcxl.emu"""
