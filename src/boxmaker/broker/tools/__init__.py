"""The tools brokerd runs for a decided call: the file tools (files.py, over
file_walk.py; write_target.py looks before a write), shell.py and http_get.py, with
what they ask of the machine (host.py). broker/runner.py dispatches a RunSpec to them."""
