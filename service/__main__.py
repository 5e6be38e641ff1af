import sys

if sys.argv[1:2] == ["endpoint-standby"]:  # the standby endpoint router (endpoint_standby.py)
    from .endpoint_standby import main

    main(sys.argv[2:])
else:
    from .app import main

    main()
