func.func @f(%a: i32) {
  %r = foo.bar %a : i32
  return
}
