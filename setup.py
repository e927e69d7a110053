"""Maps the top-level folders envs/ kernels/ eval/ conf/ into the single `agentq` namespace (agentq.envs, …).

pyproject.toml holds the metadata; this file only computes `packages`/`package_dir`, because
setuptools' static `package-dir` table cannot discover sub-packages of remapped folders.
"""
from setuptools import find_packages, setup

FOLDERS = {"agentq": "agentq", "agentq.envs": "envs", "agentq.kernels": "kernels",
           "agentq.eval": "eval", "agentq.conf": "conf"}

packages, package_dir = [], {}
for name, folder in FOLDERS.items():
    package_dir[name] = folder
    packages.append(name)
    for sub in find_packages(folder):
        packages.append(f"{name}.{sub}")
        package_dir[f"{name}.{sub}"] = f"{folder}/{sub.replace('.', '/')}"

setup(packages=packages, package_dir=package_dir)
