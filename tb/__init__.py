"""kvcxl.tb"""
