func.func @f(%a: i32) {
  "foo.bar"(%a) : (i32) -> ()
  return
}
