from gpulab.service.experiments.server import main

main()
