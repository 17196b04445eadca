"""The embedded default backend: submitit's LocalExecutor on this host.

dispatcher.py   LocalDispatcher: trials as child processes of the launch, GPUs handed out
"""
