from parcel_hpc.cli import main

main()
