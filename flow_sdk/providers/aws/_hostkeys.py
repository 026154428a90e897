"""A node's SSH host key, as its bootstrap prints it to the serial console.

``bootstrap.sh.tmpl`` writes the node's public host keys (``ssh_host_*_key.pub``, type and
key only) between two marker lines, like cloud-init does, before anything slow runs. EC2's
``GetConsoleOutput`` returns that text (botocore decodes its base64), readable by whoever may
describe the instance and nobody on the network: the client pins the ed25519 key found there,
so nothing is ever trusted on first use. Only public keys are printed; the user-data holds no key material.
"""

from __future__ import annotations

import base64
import binascii
import re

from flow_sdk.errors import ProviderError

BEGIN = "-----BEGIN FLOW HOST KEYS-----"
END = "-----END FLOW HOST KEYS-----"
KEY_TYPE = "ssh-ed25519"
_KEY_LINE_RE = re.compile(r"^(ssh-ed25519) (AAAA[A-Za-z0-9+/]+={0,2})$")


def _valid_ed25519(data: str) -> bool:
    """The key blob is an OpenSSH ed25519 public key: its type string, then 32 key bytes."""
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return False
    name = KEY_TYPE.encode()
    prefix = len(name).to_bytes(4, "big") + name + (32).to_bytes(4, "big")
    return len(raw) == len(prefix) + 32 and raw.startswith(prefix)


def host_keys(console: str) -> list[str]:
    """The ed25519 host keys of every complete marker block in ``console``, in order."""
    found: list[str] = []
    inside = False
    block: list[str] = []
    for line in console.splitlines():
        text = line.strip().rstrip("\r")
        if text == BEGIN:
            inside, block = True, []
        elif text == END and inside:
            inside = False
            found.extend(block)
        elif inside:
            match = _KEY_LINE_RE.match(text)
            if match and _valid_ed25519(match.group(2)):
                block.append(f"{match.group(1)} {match.group(2)}")
    return found


def pinned_host_key(console: str, instance_id: str) -> str:
    """The one ed25519 host key the node published. ProviderError when it has published none
    yet, or when the console shows different keys (then none is trusted)."""
    keys = list(dict.fromkeys(host_keys(console)))
    if not keys:
        raise ProviderError(f"node {instance_id} has not published its SSH host key yet (its "
                            "serial console shows no flow host key block); it is still "
                            "booting: retry in a minute")
    if len(keys) > 1:
        raise ProviderError(f"the serial console of node {instance_id} shows {len(keys)} "
                            "different ed25519 host keys; refusing to pin any of them")
    return keys[0]
