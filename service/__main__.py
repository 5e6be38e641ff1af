import sys

if sys.argv[1:2] == ["endpoint-standby"]:  # the standby endpoint router (endpoints/standby.py)
    from gpulab.service.endpoints.standby import main

    main(sys.argv[2:])
else:
    from gpulab.service.app import main

    main()
