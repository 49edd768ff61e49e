from hetrain.cli import console_main

console_main()
