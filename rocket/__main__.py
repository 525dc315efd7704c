from rocket.cli import main

main()
