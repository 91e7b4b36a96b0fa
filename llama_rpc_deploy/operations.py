"""A pyinfra operation this project needs and pyinfra has not got."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import FileUploadCommand, operation
from pyinfra.api.util import get_file_sha1
from pyinfra.facts.files import File, Sha1File
from pyinfra.operations.util import files as file_utils


@operation()
def secret_file(src: str, dest: str, user: str, group: str, mode: str = "400"):
    """Upload a secret file. Like files.put, except that its content is never shown (files.put prints
    it with --diff) and the upload goes through a temporary file next to dest (whose folder is mode 700),
    not through /tmp."""
    same = host.get_fact(Sha1File, path=dest) == get_file_sha1(src)
    info = host.get_fact(File, path=dest) or {}
    if not same:
        yield FileUploadCommand(src, dest, remote_temp_filename=f"{dest}.uploading")
    if not same or (info.get("user"), info.get("group")) != (user, group):
        yield file_utils.chown(dest, user, group)
    if not same or str(info.get("mode")) != mode:
        yield file_utils.chmod(dest, mode)
