"""Host data a host should never get to obey: terminal escapes and rich markup."""

# OSC 0 (window title), OSC 52 (clipboard write), OSC 8 (hyperlink), CSI 2J (clear), a lone C1 CSI
HOSTILE = ("\x1b]0;owned\x07", "\x1b]52;c;cm0gLXJmIH4=\x07", "\x1b]8;;http://evil.invalid\x1b\\click\x1b]8;;\x1b\\",
           "\x1b[2J", "\x9b31m")
MARKUP = ("[/]", "[link=http://evil.invalid]x[/link]", "[bold red]loud[/]")
