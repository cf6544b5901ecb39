"""The TVM work. Runs only inside the sandbox (webapp/jobs/sandbox.py):

python -m webapp.pipeline JOB_DIR
"""
