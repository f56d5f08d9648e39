from burla.cli import main

main()
