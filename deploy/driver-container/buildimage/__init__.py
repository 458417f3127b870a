"""``build-image``: the NVIDIA driver image for modstage hosts, built and signed in one command.

The package behind ``deploy/driver-container/build-image`` (see ``cli``). It runs on the
build machine, never in the image, and reads like its pipeline:

* :mod:`buildimage.archive`: Debian's packages, fetched with an apt configuration of the
  build cache's own (the machine's apt sources are never touched);
* :mod:`buildimage.kernel`: one target kernel's files (headers, ``sign-file``, image,
  in-tree modules), in this machine's root or a Debian root of that release's own;
* :mod:`buildimage.nvidia`: NVIDIA's modules built from ``nvidia-kernel-source`` as DKMS
  builds them (kbuild, then ``strip -g``), cached per version and kernel; the GSP firmware
  and ``nvidia-smi`` of the same version;
* :mod:`buildimage.sign`: each module signed with its kernel's own ``sign-file``, then judged
  by ``modstage verify`` against that kernel's files and the given certificate;
* :mod:`buildimage.oci`: the image written as an OCI image layout and archive, no container
  run;
* :mod:`buildimage.cli`: the command, which writes nothing until every module is accepted.

Every failure is a :class:`BuildError` whose words name what failed and why.
"""

from __future__ import annotations


class BuildError(RuntimeError):
    """The image could not be built; the message names the package, kernel or module, and why."""
