"""The front end: .mask text to a resolved mask. parse (the Lark grammar to the syntax IR, without
recursion; syntax_errors puts Lark's errors in words, located), sources (reading files and sandboxed imports),
resolve (names, types, lets and mask calls inlined), with scope (what a name means where it is used), params
(parameter declarations), calls (built-in, let and mask calls) and score (score modifiers).
"""
