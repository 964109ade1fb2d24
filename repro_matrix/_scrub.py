"""Scrubbing: take what identifies a person or a machine out of a report before it is shared.

Replaced, in this order, by placeholders:

- home folders (``/home/alice``, ``/Users/alice`` and macOS's volume paths to it such as
  ``/System/Volumes/Data/Users/alice``, ``C:\\Users\\alice``, ``~alice/`` → ``<home>``), only at a path
  boundary: a home that is the prefix of another path (``/home/al`` and ``/home/alice``) never replaces part
  of the longer one;
- credentials in URLs (``http://bob:pa55word@host/`` → ``http://<user>:<secret>@host/``);
- secrets: API keys and tokens with a known shape (``sk-…``, ``hf_…``, ``ghp_…``, AWS key ids, JWTs),
  bearer tokens, ``--api-key X`` / ``api_key=X`` / ``"token": "X"`` and the values of environment
  variables whose names say KEY, TOKEN, SECRET or PASSWORD;
- e-mail addresses, IPv4 and IPv6 addresses (loopback and unspecified addresses are kept: they say
  nothing about anyone);
- user names and host names, as whole words: the current user (login name and full name), every home
  folder's owner, every name this machine goes by (node name, resolver name, ``/etc/hostname``, on macOS
  the computer name), and any given; host names in any case.

``scrub`` returns the clean text and what it removed, so that the user can see it.
"""

from __future__ import annotations

import getpass
import ipaddress
import os
import platform
import pwd
import re
import socket
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Removed", "Scrubber", "scrub"]

_HOME_ROOTS = ("/home/", "/Users/", "/users/", "/export/home/", "/var/home/")
# shapes of secrets that stand on their own
_SECRET_SHAPES = [
    r"sk-(?:proj-|ant-)?[A-Za-z0-9_\-]{16,}",
    r"hf_[A-Za-z0-9]{20,}",
    r"gh[pousr]_[A-Za-z0-9]{20,}",
    r"github_pat_[A-Za-z0-9_]{20,}",
    r"glpat-[A-Za-z0-9_\-]{16,}",
    r"xox[abprs]-[A-Za-z0-9\-]{10,}",
    r"AKIA[0-9A-Z]{16}",
    r"AIza[0-9A-Za-z_\-]{30,}",
    r"eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",
]
# a labelled secret: the label stays, the value goes
_SECRET_LABELLED = re.compile(
    r"""(?ix)
    (?P<label>
        (?:authorization\s*[:=]\s*)?bearer\s+
      | --(?:api[-_]?key|token|password|secret)[=\s]+
      | ["']?[A-Za-z0-9_\-]*(?:api[-_]?key|token|secret|password|passwd|access[-_]?key)["']?\s*[:=]\s*["']?
    )
    (?P<value>[^\s"',;)\]}]{4,})
    """
)
# user[:password]@ after a URL scheme
_URL_CRED = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<user>[^\s:/@<>]+)(?::(?P<pw>[^\s/@<>]+))?@"
)
# a Windows home folder, either slash: C:\Users\alice, c:/Users/alice, D:\Documents and Settings\alice
_WIN_HOME = re.compile(
    r"(?i)(?<![\w])[A-Z]:[\\/]+(?:Users|Documents and Settings)[\\/]+(?P<name>[^\\/\s\"'<>:|?*]+)"
)
# a macOS home seen through a volume path; <home> for the whole of it
_MAC_VOLUME_HOME = re.compile(
    r"(?<![\w.\-])(?:/System/Volumes/Data|/Volumes/[^/\n]+?)/Users/(?P<name>[A-Za-z0-9_][\w.\-]*?)"
    r"(?=/|$|[\s\"'<>:;,)\]])"
)
# ~alice/x (a path: not ~/, not "~half of", not a ~ inside a word)
_TILDE_HOME = re.compile(r"(?<![\w~])~(?P<name>[A-Za-z_][\w.\-]*[\w])(?=/)")
_SECRET_NAME = re.compile(r"(?i)(key|token|secret|password|passwd|credential)")
_EMAIL = re.compile(r"[A-Za-z0-9._%+\-]+@[A-Za-z0-9.\-]+\.[A-Za-z]{2,}")
_IPV4 = re.compile(r"(?<![\w.])(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})(?![\w]|\.\d)")
_IPV6_CANDIDATE = re.compile(r"(?<![\w:])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?:%\w+)?(?![\w:])")
# a path component ends at "/", at the end, or at anything that cannot continue a name (a final "." is
# punctuation, "./x" is not)
_PATH_END = r"(?![\w\-]|\.[\w\-])"
_KEEP_IPS = {"127.0.0.1", "0.0.0.0", "::1", "::"}
# names too common to be anyone's (the word "root" in a report is not about a person)
_GENERIC_NAMES = {
    "root",
    "nobody",
    "user",
    "admin",
    "ubuntu",
    "runner",
    "localhost",
    "local",
    "docker",
    "daemon",
    "bin",
    "sys",
    "sync",
    "games",
    "man",
    "mail",
    "news",
    "www",
    "backup",
    "list",
    "proxy",
    "build",
    "strata",
    "ci",
    "test",
    "tests",
    "home",
    "host",
}


def _machine_names() -> list[str]:
    """Every name this machine goes by: the kernel's node name, the resolver's, /etc/hostname, $HOSTNAME,
    and on macOS the computer and Bonjour names (``scutil``), e.g. "Alice's MacBook Pro"."""
    names: list[str] = []
    for fn in (socket.gethostname, socket.getfqdn, platform.node):
        try:
            names.append(fn())
        except OSError:
            continue
    names.append(os.environ.get("HOSTNAME", ""))
    try:
        names.append(Path("/etc/hostname").read_text().strip())
    except OSError:
        pass
    if platform.system() == "Darwin":
        for key in ("ComputerName", "LocalHostName", "HostName"):
            try:
                out = subprocess.run(["scutil", "--get", key], capture_output=True, text=True, timeout=5)
            except (OSError, subprocess.SubprocessError):
                continue
            if out.returncode == 0:
                names.append(out.stdout.strip())
    return [n for n in dict.fromkeys(names) if n]


@dataclass
class Removed:
    kind: str  # home, key, email, ip, user, host
    original: str
    placeholder: str
    count: int


@dataclass
class Scrubber:
    """What to remove. ``Scrubber.for_this_machine()`` fills it from the running system."""

    homes: list[str] = field(default_factory=list)
    users: list[str] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)  # literal values (e.g. from the environment)

    @classmethod
    def for_this_machine(
        cls,
        *,
        extra_homes: Iterable[str] = (),
        extra_users: Iterable[str] = (),
        extra_hosts: Iterable[str] = (),
        extra_secrets: Iterable[str] = (),
    ) -> Scrubber:
        homes = [os.path.expanduser("~"), *extra_homes]
        users: list[str] = list(extra_users)
        try:
            users.append(getpass.getuser())
        except (KeyError, OSError):
            pass
        users += [os.environ.get(v, "") for v in ("USER", "LOGNAME", "SUDO_USER")]
        try:
            for pw in pwd.getpwall():
                # people have a login shell and a home under a home root
                if pw.pw_dir.startswith(_HOME_ROOTS) or pw.pw_uid >= 1000 and pw.pw_dir not in ("/", ""):
                    if pw.pw_dir.startswith(_HOME_ROOTS):
                        homes.append(pw.pw_dir)
                    users.append(pw.pw_name)
        except OSError:
            pass
        try:  # the name people know the account by (GECOS: "Alice Smith,,,")
            me = pwd.getpwuid(os.getuid())
            users += [me.pw_name, me.pw_gecos.split(",")[0].strip()]
            if me.pw_dir.startswith(_HOME_ROOTS):
                homes.append(me.pw_dir)
        except (KeyError, OSError):
            pass
        hosts = list(extra_hosts)
        for h in _machine_names():
            hosts += [h, h.split(".")[0]]
        secrets = list(extra_secrets)
        for name, value in os.environ.items():
            if _SECRET_NAME.search(name) and len(value) >= 8 and not value.startswith("/"):
                secrets.append(value)
        return cls(homes=homes, users=users, hosts=hosts, secrets=secrets)

    def scrub(self, text: str) -> tuple[str, list[Removed]]:
        removed: dict[tuple[str, str], Removed] = {}

        def note(kind: str, original: str, placeholder: str) -> str:
            r = removed.setdefault((kind, original), Removed(kind, original, placeholder, 0))
            r.count += 1
            return placeholder

        # 1. homes, longest first, at a path boundary on both sides
        homes = sorted(
            {h.rstrip("/") for h in self.homes if h and h.rstrip("/") not in ("", "/")}, key=len, reverse=True
        )
        for h in homes:
            pat = re.compile(r"(?<![\w.\-])" + re.escape(h) + _PATH_END)
            text = pat.sub(lambda m: note("home", m.group(0), "<home>"), text)
        # any other home folder under a home root, e.g. /home/bob/x in a log from another machine
        other = re.compile(
            r"(?<![\w.\-])(?:" + "|".join(re.escape(r) for r in _HOME_ROOTS) + r")"
            r"(?P<name>[A-Za-z0-9_](?:[\w\-]|\.(?=[\w\-]))*)" + _PATH_END
        )
        extra_users: list[str] = []

        def other_home(m: re.Match[str]) -> str:
            if m.group(0).startswith(("/Users/", "/users/")) and m.group("name").lower() in (
                "shared",
                "guest",
            ):
                return m.group(0)  # macOS's folders for everyone
            extra_users.append(m.group("name"))
            return note("home", m.group(0), "<home>")

        text = other.sub(other_home, text)
        text = re.sub(r"(?<![\w.\-])/root" + _PATH_END, lambda m: note("home", m.group(0), "<home>"), text)

        def win_home(m: re.Match[str]) -> str:
            if m.group("name").lower() in ("public", "default", "all users"):
                return m.group(0)
            extra_users.append(m.group("name"))
            return note("home", m.group(0), "<home>")

        text = _WIN_HOME.sub(win_home, text)

        # macOS: the same home seen through a volume (/System/Volumes/Data/Users/bob, /Volumes/Disk/Users/bob)
        def mac_home(m: re.Match[str]) -> str:
            if m.group("name").lower() in ("shared", "guest"):
                return m.group(0)
            extra_users.append(m.group("name"))
            return note("home", m.group(0), "<home>")

        text = _MAC_VOLUME_HOME.sub(mac_home, text)

        # ~name/... (a shell's way of writing another user's home)
        def tilde_home(m: re.Match[str]) -> str:
            extra_users.append(m.group("name"))
            return note("home", m.group(0), "<home>")

        text = _TILDE_HOME.sub(tilde_home, text)

        # 1b. credentials in URLs: the user and the password, whoever's they are
        def url_cred(m: re.Match[str]) -> str:
            user = note("user", m.group("user"), "<user>")
            pw = ":" + note("key", m.group("pw"), "<secret>") if m.group("pw") else ""
            return m.group("scheme") + user + pw + "@"

        text = _URL_CRED.sub(url_cred, text)

        # 2. secrets
        for value in sorted({s for s in self.secrets if len(s) >= 6}, key=len, reverse=True):
            text = text.replace(value, note("key", value, "<secret>")) if value in text else text
        for shape in _SECRET_SHAPES:
            text = re.sub(shape, lambda m: note("key", m.group(0), "<secret>"), text)

        def labelled(m: re.Match[str]) -> str:
            v = m.group("value")
            if v in ("<secret>", "<key>") or v.startswith("<"):
                return m.group(0)
            return m.group("label") + note("key", v, "<secret>")

        text = _SECRET_LABELLED.sub(labelled, text)

        # 3. e-mail and IP addresses
        text = _EMAIL.sub(lambda m: note("email", m.group(0), "<email>"), text)

        def ipv4(m: re.Match[str]) -> str:
            s = m.group(0)
            if any(int(g) > 255 for g in m.groups()) or s in _KEEP_IPS:
                return s
            return note("ip", s, "<ip>")

        text = _IPV4.sub(ipv4, text)

        def ipv6(m: re.Match[str]) -> str:
            s = m.group(0)
            try:
                ipaddress.IPv6Address(s.split("%")[0])
            except ValueError:
                return s
            if s in _KEEP_IPS:
                return s
            return note("ip", s, "<ip>")

        text = _IPV6_CANDIDATE.sub(ipv6, text)

        # 4. host and user names, whole words, longest first (a host name often contains the user's)
        hosts = {h for h in self.hosts if h and len(h) >= 2 and h.lower() not in _GENERIC_NAMES}
        for h in sorted(hosts, key=len, reverse=True):
            # host names are case-insensitive (VM.local, vm and Vm are one machine)
            text = re.sub(
                r"(?i)(?<![\w\-])" + re.escape(h) + r"(?![\w\-])",
                lambda m: note("host", m.group(0), "<host>"),
                text,
            )
        users = {
            u for u in [*self.users, *extra_users] if u and len(u) >= 2 and u.lower() not in _GENERIC_NAMES
        }
        for u in sorted(users, key=len, reverse=True):
            text = re.sub(
                r"(?<![\w\-])" + re.escape(u) + r"(?![\w\-])",
                lambda m: note("user", m.group(0), "<user>"),
                text,
            )
        return text, sorted(removed.values(), key=lambda r: (r.kind, r.original))


def scrub(text: str, scrubber: Scrubber | None = None) -> tuple[str, list[Removed]]:
    """Scrub ``text`` with ``scrubber`` (default: what this machine and its environment reveal)."""
    return (scrubber or Scrubber.for_this_machine()).scrub(text)
