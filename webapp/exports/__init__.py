"""What a job gives to run elsewhere: a kernel's reproducer (repro.py, with repro_script.py as its
run.py) and a build's package, model.tar (package.py, with package_run.py as its run.py). The two
scripts ship inside the archives and need apache-tvm and numpy alone."""
