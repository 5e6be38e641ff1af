"""gpulab.scheduler"""
