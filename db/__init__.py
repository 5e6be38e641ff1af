"""gpulab.db: every table gpulab keeps, its engine, and the migrations between schemas."""
